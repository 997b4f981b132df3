"""`rlfleet train ALGO --env pettingzoo:...` and `rlfleet play` on a multi-agent run."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pettingzoo")

from rlfleet.cli.main import main

TICTACTOE = "pettingzoo:pettingzoo.classic.tictactoe_v3"


@pytest.mark.parametrize("share", [True, False], ids=["shared", "independent"])
def test_train_then_play(tmp_path: Path, share: bool, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "--env", TICTACTOE, "--trainer.max-episodes", "40"]
    args += ["--trainer.test-freq", "40", "--trainer.episodes-per-test", "4"]
    args += ["--trainer.run-dir", str(run_dir), "--num-epochs", "1"]
    assert main([*args, *(["--share-parameters"] if share else [])]) == 0
    assert (run_dir / "history.parquet").is_file()
    assert (run_dir / "plots" / "metric.png").is_file()
    saved = sorted(p.name for p in (run_dir / "best").iterdir())
    assert saved == (["player_1"] if share else ["player_1", "player_2"])
    assert main(["play", str(run_dir), "--frame-dir", str(tmp_path / "frames")]) == 0
    out = capsys.readouterr().out
    assert "player_1 plays" in out
    assert "returns player_1" in out
    assert any((tmp_path / "frames").rglob("*.png"))


def test_unknown_pettingzoo_module_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "ppo", "--env", "pettingzoo:pettingzoo.classic.nope_v0"]) == 2
    assert "pettingzoo.classic.nope_v0" in capsys.readouterr().err
