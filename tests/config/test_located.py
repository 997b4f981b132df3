"""YAML files are read within bounds: regular UTF-8 files of a sane size, and documents whose
aliases expand to a bounded number of nodes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlfleet.config import located
from rlfleet.config.loader import load_yaml
from rlfleet.config.located import MAX_NODES, parse_yaml, read_config_text
from rlfleet.errors import ConfigError

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 10)}]\n"
    for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
"""A "billion laughs" document: 10⁹ strings once its nine levels of aliases are expanded."""


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"bomb\.yaml: YAML aliases expand to [\d,]+ nodes"):
        parse_yaml(LAUGHS, "bomb.yaml")
    path = tmp_path / "bomb.yaml"
    path.write_text(LAUGHS)
    with pytest.raises(ConfigError, match="YAML aliases expand to"):
        load_yaml(path)


def test_aliases_within_the_budget_are_read_as_before() -> None:
    text = "base: &base {lr: 0.001, layers: [64, 64]}\na: *base\nb: [*base, *base]\n"
    data = parse_yaml(text, "ok.yaml")
    assert data["a"] == {"lr": 0.001, "layers": [64, 64]}
    assert data["b"] == [data["a"], data["a"]]


def test_the_budget_counts_expanded_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "a: &a [1, 2, 3]\nb: [*a, *a, *a]\n"  # 1 + 2 keys + 4 + 1 + 3 x 4 = 20 nodes
    parse_yaml(text, "small.yaml")
    monkeypatch.setattr(located, "MAX_NODES", 19)
    with pytest.raises(ConfigError, match="expand to 20 nodes, more than 19"):
        parse_yaml(text, "small.yaml")
    assert MAX_NODES >= 1_000_000


def test_a_recursive_alias_is_still_named_as_such() -> None:
    with pytest.raises(ConfigError, match="recursive"):
        parse_yaml("a: &a [*a]\n", "loop.yaml")


def test_devices_fifos_and_binary_files_are_not_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"/dev/zero: cannot read config file \(not a regular"):
        read_config_text("/dev/zero")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    # Opening a FIFO for reading blocks until a writer comes: one is opened non-blocking here,
    # so the test shows the refusal rather than hanging if it were read.
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        with pytest.raises(ConfigError, match="not a regular file"):
            read_config_text(fifo)
    finally:
        os.close(writer)
    binary = tmp_path / "config.yaml"
    binary.write_bytes(b"algo: ppo\n\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"not UTF-8 text: byte 0xff at offset 10"):
        load_yaml(binary)
    with pytest.raises(ConfigError, match="cannot read config file"):
        read_config_text(tmp_path / "missing.yaml")


def test_a_file_over_the_size_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("a: 1\n" * 100)
    monkeypatch.setattr(located, "MAX_FILE_BYTES", 100)
    with pytest.raises(ConfigError, match=r"big\.yaml: cannot read config file \(larger than"):
        read_config_text(big)
