"""``silofl backbone train``: a frozen feature network trained on data the user declares public (``--features
backbone:DIR``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from silofl.cli.common import friendly_errors

backbone_app = typer.Typer(
    no_args_is_help=True, help="Feature backbones trained on data declared public (--features backbone:DIR)."
)
console = Console(soft_wrap=True)


@backbone_app.command("train")
@friendly_errors
def backbone_train(
    dataset: str = typer.Option(..., "--dataset", help="The data set the runs will use (its input shape)."),
    public: str = typer.Option(
        ...,
        "--public",
        help="The rows you declare public: 'validation' (the validation rows "
        "of the split given by --split-seed etc., held by no client) or another image data set "
        "(e.g. mnist), all its training rows.",
    ),
    out: Path = typer.Option(
        ..., "--out", help="Folder to write (backbone.safetensors/.json, card.json, MODEL_CARD.md)."
    ),
    model: str = typer.Option(
        "cnn1", "--model", help="Architecture (its penultimate layer gives the features)."
    ),
    epochs: int = typer.Option(5, "--epochs"),
    lr: float = typer.Option(1e-3, "--lr"),
    batch_size: int = typer.Option(128, "--batch-size"),
    data_dir: str | None = typer.Option(None, "--data-dir"),
    split_seed: int | None = typer.Option(
        None, "--split-seed", help="--public validation: the runs' split seed."
    ),
    clients: int | None = typer.Option(None, "--clients", help="--public validation: the runs' clients."),
    samples_per_client: int | None = typer.Option(None, "--samples-per-client"),
    partition: str | None = typer.Option(None, "--partition"),
    p_major: float | None = typer.Option(None, "--p-major"),
    validation_size: int | None = typer.Option(None, "--validation-size"),
    seed: int = typer.Option(0, "--seed", help="Seed of the (non-private) training on public data."),
    threads: int | None = typer.Option(None, "--threads"),
):
    """Train a backbone on declared-public rows; a run uses it with --features backbone:OUT."""
    from silofl.experiments.backbone import train_backbone

    split = {
        "split_seed": split_seed,
        "clients": clients,
        "samples_per_client": samples_per_client,
        "partition": partition,
        "p_major": p_major,
        "validation_size": validation_size,
    }
    card = train_backbone(
        dataset,
        public,
        out,
        model=model,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        data_dir=data_dir,
        seed=seed,
        split=split,
        threads=threads,
    )
    pub = card["public_data"]
    console.print(
        f"backbone {model} → {out}: trained on {pub['description']}; features {card['feature_shape']}; "
        f"held-out public accuracy {card['training']['held_out_public_accuracy']:.4f}. Use it with "
        f"--features backbone:{out}"
    )
