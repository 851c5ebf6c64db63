"""What computing every classification metric costs next to accuracy alone, measured side by side.

    .venv/bin/python bench/eval_metrics.py [--repeats 5] [--threads 2] [--n 10000]

The evaluation of a ProxyFL round on the papers' benchmark: 8 LeNet5 + 8 MLP (Fashion-MNIST shapes, 10
classes)
scored on n test images, each architecture in one vectorised pass. Interleaved repeats of
:func:`silofl.training.evaluation.accuracies` (accuracy only, as before) and
:func:`silofl.training.evaluation.all_scores` (the same pass, logits kept, then accuracy, AUROC, balanced
accuracy,
macro F1 and ECE per model); medians and their ratio are printed, and every ``acc`` of the second is checked
to
equal the first's accuracy. Inputs are random images and labels (the cost does not depend on what the images
show);
the models are freshly initialised.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from silofl.models import build_model
from silofl.training.evaluation import accuracies, all_scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", type=int, default=10000)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    models = [build_model("lenet5", (1, 28, 28), 10) for _ in range(8)] + [
        build_model("mlp", (1, 28, 28), 10) for _ in range(8)
    ]
    x, y = torch.rand(a.n, 1, 28, 28), torch.randint(0, 10, (a.n,))
    acc_s, all_s = [], []
    same = True
    for _ in range(a.repeats + 1):  # the first pair warms up
        t0 = time.perf_counter()
        accs = accuracies(models, x, y)
        t1 = time.perf_counter()
        sc = all_scores(models, x, y)
        t2 = time.perf_counter()
        acc_s.append(t1 - t0)
        all_s.append(t2 - t1)
        same = same and [s["acc"] for s in sc] == accs
    ma, mb = statistics.median(acc_s[1:]), statistics.median(all_s[1:])
    print(
        f"16 models (8 LeNet5 + 8 MLP) on {a.n} images, {torch.get_num_threads()} threads, medians of "
        f"{a.repeats} "
        f"interleaved repeats:"
    )
    print(
        f"  accuracy only: {ma:.3f} s; every metric (accuracy, AUROC, balanced accuracy, F1, ECE): {mb:.3f} "
        f"s; "
        f"ratio {mb / ma:.2f}×"
    )
    print(f"  accuracies identical: {same}")


if __name__ == "__main__":
    main()
