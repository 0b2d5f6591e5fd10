"""Published weights by name: ``hf-hub:ORG/NAME`` (a model repository on the Hugging Face Hub, a timm tag
such as ``hf-hub:timm/vit_small_patch16_224.augreg_in21k_ft_in1k`` or an HF ViT such as
``hf-hub:google/vit-base-patch16-224``; ``@REVISION`` after it picks a branch, tag or commit), or a vitkit
model name that has published weights (``PRETRAINED``), resolved to a folder on this machine.

``resolve_weights`` is the one place names become folders; the readers (``convert.read``,
``convert.detect_format``, ``convert.load_any``) call it, so every command and ``create_model`` that
takes a weights path takes a name as well. A path that exists is always the path.

Downloads go through ``huggingface_hub`` (``pip install 'vitkit[hub]'``) into its own cache, and only
the files a model needs: config.json, preprocessor_config.json and model.safetensors (pytorch_model.bin
where a repository has no safetensors). huggingface_hub reads its own environment: HF_HUB_OFFLINE=1
(use the cache only), HF_HOME, HF_HUB_CACHE (where the cache is), HF_TOKEN (private or gated repos).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import CheckpointError, ConfigError
from .checkpoint import CONFIG, WEIGHTS

HUB_PREFIX = "hf-hub:"

# vitkit model name -> its published weights on the Hub: timm's default tag for that architecture (the
# first weights timm lists for it), so that create_model(name, pretrained=True) gives what
# timm.create_model(name, pretrained=True) gives. Names whose architecture timm publishes no weights
# for (vit_large_patch14_224, vit_giant_patch14_224, vit_base_patch16_gap_224, the I-JEPA *_gap_* models)
# have none. A plain dict: an entry added at run time maps another name.
PRETRAINED: dict[str, str] = {
    "vit_tiny_patch16_224": "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k",
    "vit_tiny_patch16_384": "timm/vit_tiny_patch16_384.augreg_in21k_ft_in1k",
    "vit_small_patch8_224": "timm/vit_small_patch8_224.dino",
    "vit_small_patch16_224": "timm/vit_small_patch16_224.augreg_in21k_ft_in1k",
    "vit_small_patch16_384": "timm/vit_small_patch16_384.augreg_in21k_ft_in1k",
    "vit_small_patch32_224": "timm/vit_small_patch32_224.augreg_in21k_ft_in1k",
    "vit_small_patch32_384": "timm/vit_small_patch32_384.augreg_in21k_ft_in1k",
    "vit_base_patch8_224": "timm/vit_base_patch8_224.augreg2_in21k_ft_in1k",
    "vit_base_patch16_224": "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k",
    "vit_base_patch16_384": "timm/vit_base_patch16_384.augreg_in21k_ft_in1k",
    "vit_base_patch32_224": "timm/vit_base_patch32_224.augreg_in21k_ft_in1k",
    "vit_base_patch32_384": "timm/vit_base_patch32_384.augreg_in21k_ft_in1k",
    "vit_large_patch16_224": "timm/vit_large_patch16_224.augreg_in21k_ft_in1k",
    "vit_large_patch16_384": "timm/vit_large_patch16_384.augreg_in21k_ft_in1k",
    "vit_large_patch32_224": "timm/vit_large_patch32_224.orig_in21k",
    "vit_large_patch32_384": "timm/vit_large_patch32_384.orig_in21k_ft_in1k",
    "vit_huge_patch14_224": "timm/vit_huge_patch14_224.orig_in21k",
    "vit_medium_patch16_gap_240": "timm/vit_medium_patch16_gap_240.sw_in12k",
    "vit_medium_patch16_gap_256": "timm/vit_medium_patch16_gap_256.sw_in12k_ft_in1k",
    "vit_medium_patch16_gap_384": "timm/vit_medium_patch16_gap_384.sw_in12k_ft_in1k",
    "vit_small_patch14_reg4_dinov2": "timm/vit_small_patch14_reg4_dinov2.lvd142m",
    "vit_base_patch14_reg4_dinov2": "timm/vit_base_patch14_reg4_dinov2.lvd142m",
    "vit_large_patch14_reg4_dinov2": "timm/vit_large_patch14_reg4_dinov2.lvd142m",
}

# the files fetched from a repository: the configs and the safetensors weights (one file, or shards and
# their index); the pickled weights only where a repository has no safetensors
FILES = tuple(dict.fromkeys((CONFIG, "config.json", "preprocessor_config.json", WEIGHTS, "model.safetensors",
                             "model.safetensors.index.json", "model-*-of-*.safetensors")))
FALLBACK_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")

_resolved: dict[str, Path] = {}  # a name is resolved once a process (a run reads its weights more than once)


def pretrained_name(name: str) -> str:
    """The ``hf-hub:`` name of model ``name``'s published weights (``PRETRAINED``); a ConfigError where it
    has none."""
    tag = PRETRAINED.get(name)
    if tag is None:
        raise ConfigError(f"pretrained: model {name!r} has no published weights vitkit knows of; give "
                          "weights='hf-hub:ORG/NAME' (names with weights: vitkit.io.hub.PRETRAINED)")
    return HUB_PREFIX + tag


def hub_source(src) -> str | None:
    """The ``hf-hub:`` name ``src`` stands for: itself, or a vitkit model name with published weights when
    no file or folder of that name exists here; None for anything else (a path)."""
    if not isinstance(src, str):
        return None
    if src.startswith(HUB_PREFIX):
        return src
    if src in PRETRAINED and not os.path.lexists(src):
        return HUB_PREFIX + PRETRAINED[src]
    return None


def hub_hint(src) -> str:
    """A hint for a path that does not exist but reads as ORG/NAME: how a Hub repository is written."""
    text = str(src)
    parts = text.split("/")
    if len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and not Path(parts[0]).exists():
        return f" (a model on the Hugging Face Hub is written {HUB_PREFIX}{text})"
    return ""


def resolve_weights(src):
    """``src`` as a local path: a Hub name (``hub_source``) downloaded (or found in the cache), anything
    else returned as it is."""
    name = hub_source(src)
    if name is None:
        return src
    if name not in _resolved:
        _resolved[name] = download(name)
    return _resolved[name]


def split_name(name: str) -> tuple[str, str | None]:
    """(repo id, revision or None) of ``hf-hub:ORG/NAME[@REVISION]``; a ConfigError for a malformed one."""
    body = name[len(HUB_PREFIX):] if name.startswith(HUB_PREFIX) else name
    repo, _, revision = body.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or (_ and not revision):
        raise ConfigError(f"{name}: expected {HUB_PREFIX}ORG/NAME or {HUB_PREFIX}ORG/NAME@REVISION")
    return repo, revision or None


def download(name: str) -> Path:
    """The local folder of Hub model ``name`` (``hf-hub:ORG/NAME[@REVISION]``), downloaded into
    huggingface_hub's cache where it is not there yet; every failure is one CheckpointError naming it."""
    repo, revision = split_name(name)
    try:
        import huggingface_hub as hub
    except ImportError:
        raise ConfigError(f"{name}: weights from the Hugging Face Hub need the huggingface_hub package: "
                          "pip install 'vitkit[hub]'") from None
    try:
        folder = Path(hub.snapshot_download(repo, revision=revision, allow_patterns=list(FILES)))
        if not any(folder.glob("*.safetensors*")):
            folder = Path(hub.snapshot_download(repo, revision=revision,
                                                allow_patterns=list(FILES + FALLBACK_FILES)))
    except Exception as e:  # noqa: BLE001 - huggingface_hub's errors, the network's, the disk's: one line each
        raise CheckpointError(f"{name}: {_why(e, revision)}") from None
    if not (folder / "config.json").is_file() and not (folder / CONFIG).is_file():
        raise CheckpointError(f"{name}: the repository holds no config.json (not a timm, Hugging Face or vitkit "
                              "model)")
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise CheckpointError(f"{name}: the repository holds no model.safetensors or pytorch_model.bin")
    return folder


def _why(e: Exception, revision: str | None) -> str:
    """What went wrong with a download, in words, from huggingface_hub's error classes (by name, so that
    every version of it is read alike)."""
    kinds = {c.__name__ for c in type(e).__mro__}
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
    if "RevisionNotFoundError" in kinds:
        return f"no revision {revision!r} in that repository on the Hugging Face Hub"
    if "GatedRepoError" in kinds:
        return "a gated repository: accept its terms on huggingface.co and log in (`hf auth login` or HF_TOKEN)"
    if "RepositoryNotFoundError" in kinds:
        return ("no such model on the Hugging Face Hub (a private one needs a login: `hf auth login` or "
                "HF_TOKEN)")
    if "HFValidationError" in kinds:
        return f"not a valid repository name ({first})"
    if "LocalEntryNotFoundError" in kinds or "OfflineModeIsEnabled" in kinds:
        return ("not in the local Hugging Face cache, and the Hub cannot be reached (HF_HUB_OFFLINE is set, or "
                "there is no network); download it once with network access, or set HF_HUB_CACHE to a cache "
                "that holds it")
    return f"download failed ({type(e).__name__}: {first})"


__all__ = ["HUB_PREFIX", "PRETRAINED", "pretrained_name", "hub_source", "hub_hint", "resolve_weights",
           "split_name", "download"]
