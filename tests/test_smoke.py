import torch

import vitkit


def test_create_and_forward():
    m = vitkit.create_model("vit_test", seed=0).eval()
    assert m(torch.randn(2, 3, 32, 32)).shape == (2, 10)
