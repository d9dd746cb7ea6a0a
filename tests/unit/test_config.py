"""Settings: flags over environment over TOML file over defaults, sizes with units."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli import main
from gateway.config import Settings, build_settings, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4096", 4096), ("64KiB", 64 << 10), ("64MiB", 64 << 20), ("10G", 10 << 30), ("1.5k", 1536)],
)
def test_sizes_take_binary_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_bad_size_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")


def test_toml_file_then_given_values_win(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text('[gateway]\nport = 7000\ncache-capacity = "2GiB"\nregion = "eu-west-1"\n')
    s = build_settings({"port": "7001", "region": None}, cfg)
    assert s.port == 7001  # given (flag or environment) beats the file
    assert s.cache_capacity == 2 << 30  # the file beats the default
    assert s.region == "eu-west-1"
    assert s.metadata_ttl == Settings().metadata_ttl  # the default


def test_unknown_toml_key_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text("prot = 1\n")
    with pytest.raises(ValueError, match="unknown settings prot"):
        build_settings({}, cfg)


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.toml"
    cfg.write_text(f'data_dir = "{tmp_path / "from-file"}"\n')
    runner = CliRunner()
    env = {"GATEWAY_CONFIG": str(cfg), "GATEWAY_ENCRYPTION_KEY": None}
    out = runner.invoke(main, ["migrate"], env=env)
    assert out.exit_code == 0, out.output
    assert str(tmp_path / "from-file" / "gateway.db") in out.output
    env["GATEWAY_DATA_DIR"] = str(tmp_path / "from-env")
    out = runner.invoke(main, ["migrate"], env=env)
    assert str(tmp_path / "from-env" / "gateway.db") in out.output
    out = runner.invoke(main, ["migrate", "--data-dir", str(tmp_path / "from-flag")], env=env)
    assert str(tmp_path / "from-flag" / "gateway.db") in out.output
