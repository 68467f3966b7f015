"""The model-level GPU criteria, read off the ``bench model`` folders ``scripts/gpu_check.py`` (run 2) writes: one
line per criterion with its numbers and PASS or FAIL (training images/s under bf16 autocast; ratios > 1 are faster).

* DeiT-S, eager, at each size: SimA ``auto`` over softmax at least 1.0× at 224 px, 1.3× at 512 and 2.0× at 1024;
  where the attention-free floor itself is under that ratio over softmax, no SimA can reach it, and the bar is
  the floor criterion instead; SimA within 1.15× of the floor; ``auto`` within 3 % of the better backend (its
  own row or the Triton row).
* DeiT-S compiled at 224 px: default mode, SimA at least softmax and at least SimA eager; reduce-overhead (CUDA
  graphs), SimA at least softmax.
* Semantic FPN at 1024×2048: training runs at the asked batch, SimA within 1.15× of its floor.

Usage: ``python scripts/gpu_model_check.py FOLDER`` (FOLDER holds model_eager/, model_compiled/, model_graphs/ and
model_fpn/, each with bench_model.json; a missing one is a FAIL line). Exit code 1 when any criterion fails.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

OVER_SOFTMAX = {224: 1.0, 512: 1.3, 1024: 2.0}
OVER_FLOOR = 1.15
OF_BEST = 0.97


def _rows(folder: Path, name: str, lines: List[str]) -> Optional[List[Dict[str, Any]]]:
    path = folder / name / "bench_model.json"
    if not path.exists():
        lines.append(f"FAIL {name}: no {path} (see the stage's log)")
        return None
    rows = json.loads(path.read_text())["rows"]
    for r in rows:
        if "error" in r:
            lines.append(f"FAIL {name} {r['label']} {r['img_size']} px: {r['error']}")
    return rows


def _ips(rows: List[Dict[str, Any]], label: str, size: Any) -> Optional[float]:
    return next((r.get("train_ips") for r in rows if r["label"] == label and r["img_size"] == size), None)


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def eager_lines(rows: List[Dict[str, Any]]) -> List[str]:
    lines = []
    for size, want in OVER_SOFTMAX.items():
        auto, triton, softmax, floor = (_ips(rows, label, size) for label in ("sima", "triton", "softmax", "floor"))
        if None in (auto, triton, softmax, floor):
            lines.append(f"FAIL DeiT-S eager {size} px: rows missing (sima {auto}, triton {triton}, softmax "
                         f"{softmax}, floor {floor} img/s)")
            continue
        over_floor, floor_over_softmax = floor / auto, floor / softmax
        floor_bar = floor_over_softmax < want
        speed_ok = auto / softmax >= want or (floor_bar and over_floor <= OVER_FLOOR)
        lines += [
            f"{_verdict(speed_ok)} DeiT-S eager {size} px: SimA auto {auto:.0f} img/s, softmax {softmax:.0f}: "
            f"{auto / softmax:.2f}x (want {want}x" + (f"; the floor is {floor_over_softmax:.2f}x softmax, so the "
                                                      "floor criterion is the bar)" if floor_bar else ")"),
            f"{_verdict(over_floor <= OVER_FLOOR)} DeiT-S eager {size} px: SimA auto over the attention-free floor "
            f"({floor:.0f} img/s): {over_floor:.3f}x (want <= {OVER_FLOOR}); softmax over it "
            f"{floor / softmax:.3f}x",
            f"{_verdict(auto >= OF_BEST * max(auto, triton))} DeiT-S eager {size} px: auto {auto:.0f} img/s, "
            f"Triton {triton:.0f}: auto at {auto / max(auto, triton):.3f} of the better (want >= {OF_BEST})"]
    return lines


def compiled_lines(compiled, graphs, eager) -> List[str]:
    lines = []
    if compiled is not None:
        sima, softmax, sima_eager = _ips(compiled, "sima", 224), _ips(compiled, "softmax", 224), \
            _ips(eager or [], "sima", 224)
        if None in (sima, softmax, sima_eager):
            lines.append(f"FAIL DeiT-S compiled 224 px: rows missing (sima {sima}, softmax {softmax}, sima eager "
                         f"{sima_eager})")
        else:
            lines.append(f"{_verdict(sima >= softmax and sima >= sima_eager)} DeiT-S compiled (default) 224 px: "
                         f"SimA {sima:.0f} img/s, softmax {softmax:.0f} ({sima / softmax:.2f}x), SimA eager "
                         f"{sima_eager:.0f} ({sima / sima_eager:.2f}x); want both >= 1")
    if graphs is not None:
        sima, softmax = _ips(graphs, "sima", 224), _ips(graphs, "softmax", 224)
        if None in (sima, softmax):
            lines.append(f"FAIL DeiT-S reduce-overhead 224 px: rows missing (sima {sima}, softmax {softmax})")
        else:
            lines.append(f"{_verdict(sima >= softmax)} DeiT-S compiled (reduce-overhead) 224 px: SimA {sima:.0f} "
                         f"img/s, softmax {softmax:.0f}: {sima / softmax:.2f}x (want >= 1)")
    return lines


def fpn_lines(rows: List[Dict[str, Any]]) -> List[str]:
    sima = next((r for r in rows if r["label"] == "sima"), None)
    floor = next((r for r in rows if r["label"] == "floor"), None)
    if sima is None or floor is None or "error" in sima or "error" in floor:
        return ["FAIL Semantic FPN 1024x2048: the SimA or floor row did not run"]
    asked, ran = sima.get("batch_size"), sima.get("train_batch")
    over_floor = floor["train_ips"] / sima["train_ips"]
    return [f"{_verdict(ran == asked)} Semantic FPN 1024x2048: training ran at batch {ran} (asked {asked}), peak "
            f"{sima.get('train_ips_peak_mb', 0) / 1024:.1f} GiB",
            f"{_verdict(over_floor <= OVER_FLOOR)} Semantic FPN 1024x2048: SimA {sima['train_ips']:.2f} img/s over "
            f"the floor ({floor['train_ips']:.2f}): {over_floor:.3f}x (want <= {OVER_FLOOR})"]


def main(argv: List[str]) -> int:
    folder = Path(argv[0] if argv else "runs/gpu_check")
    lines: List[str] = []
    eager = _rows(folder, "model_eager", lines)
    compiled = _rows(folder, "model_compiled", lines)
    graphs = _rows(folder, "model_graphs", lines)
    fpn = _rows(folder, "model_fpn", lines)
    lines += eager_lines(eager) if eager is not None else []
    lines += compiled_lines(compiled, graphs, eager)
    lines += fpn_lines(fpn) if fpn is not None else []
    print("\n".join(lines))
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
