"""What the input tests share: the flags of a tiny training run, and the check of a one-line error."""
from __future__ import annotations

TINY_KWARGS = ["img_size=16", "patch_size=4", "embed_dim=32", "depth=1", "num_heads=2"]
FLAGS = ["--model", "sima_deit_tiny_patch16_224", "--model-kwargs", *TINY_KWARGS, "--img-size", "16",
         "--batch-size", "8", "--lr", "2e-3", "--warmup-epochs", "0", "--steps-per-epoch", "2", "--epochs", "1",
         "--threads", "1", "--device", "cpu", "--log-interval", "100"]


def one_line_error(capsys, code: int, expected_code: int = 2) -> str:
    """stderr of a command that returned ``code``: ``expected_code`` and one line without a traceback."""
    err = capsys.readouterr().err
    assert code == expected_code, err[:2000]
    assert err.count("\n") == 1 and "Traceback" not in err, err[:2000]
    return err
