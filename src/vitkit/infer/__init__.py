"""Inference and the fast path: the rules (fastpath, torch-free), the path a run takes on this hardware
(paths), packed bf16 weights (packed), int8 (quantize) and ONNX Runtime (onnxrt)."""
