"""Where a config's values come from before they are checked (:mod:`ft_core.config_sources`): a YAML file, the
``--ft-*`` flags, a mapping; the config's field names only as arguments (the module sits below the config)."""

from __future__ import annotations

import argparse
import dataclasses
import logging

import pytest

from ft_core.config_sources import (
    NVRX_ONLY_KEYS,
    ConfigError,
    add_flags,
    flag_values,
    recognized,
    write_yaml,
    yaml_section,
)


@dataclasses.dataclass
class Fields:
    rank_heartbeat_timeout: float = 60.0
    safety_factor: float = 5.0


NAMES = [field.name for field in dataclasses.fields(Fields)]


def test_recognized_keeps_the_fields_keeps_nvrx_only_keys_apart_and_names_a_misspelling(caplog):
    nvrx_key = sorted(NVRX_ONLY_KEYS)[0]
    with caplog.at_level(logging.WARNING, logger="ft_core"):
        fields, nvrx_only = recognized({"safety_factor": 2, nvrx_key: "x", "safty_factor": 3}, NAMES)
    assert fields == {"safety_factor": 2} and nvrx_only == {nvrx_key: "x"}
    assert "safty_factor" in caplog.text and "safety_factor" in caplog.text  # the known key it resembles
    with pytest.raises(ConfigError, match="safty_factor"):
        recognized({"safty_factor": 3}, NAMES, ignore_not_recognized=False)
    with pytest.raises(ConfigError, match="a mapping of config keys to values"):
        recognized(["safety_factor"], NAMES)  # type: ignore[arg-type]


def test_the_first_fault_tolerance_mapping_at_any_depth_is_read_and_a_repeated_key_is_refused(tmp_path):
    nested = tmp_path / "cfg.yaml"
    nested.write_text("trainer:\n  callbacks:\n    fault_tolerance:\n      safety_factor: 2\n")
    assert yaml_section(nested) == {"safety_factor": 2}
    repeated = tmp_path / "twice.yaml"
    repeated.write_text("fault_tolerance:\n  safety_factor: 2\n  safety_factor: 3\n")
    with pytest.raises(ConfigError, match="safety_factor"):
        yaml_section(repeated)
    without = tmp_path / "none.yaml"
    without.write_text("trainer: {}\n")
    with pytest.raises(ConfigError, match="has no 'fault_tolerance:' mapping"):
        yaml_section(without)
    with pytest.raises(FileNotFoundError):  # as NVRx
        yaml_section(tmp_path / "missing.yaml")


def test_a_written_section_reads_back(tmp_path):
    path = tmp_path / "out.yaml"
    write_yaml({"safety_factor": 2.5, "rank_heartbeat_timeout": None}, path)
    assert yaml_section(path) == {"safety_factor": 2.5, "rank_heartbeat_timeout": None}


def test_flags_override_the_yaml_file_in_every_spelling(tmp_path):
    parser = add_flags(argparse.ArgumentParser(), dataclasses.fields(Fields),
                       {name: f"help of {name}" for name in NAMES})
    path = tmp_path / "cfg.yaml"
    path.write_text("fault_tolerance:\n  safety_factor: 2\n  rank_heartbeat_timeout: 30\n")
    for spelling in ("--ft-safety-factor", "--ft-safety_factor", "--ft_safety_factor", "--ft-param-safety-factor"):
        args = parser.parse_args(["--ft-cfg-path", str(path), f"{spelling}=7"])
        assert flag_values(args, NAMES) == {"safety_factor": "7", "rank_heartbeat_timeout": 30}
    with pytest.raises(ConfigError, match="--ft-cfg-path"):
        flag_values(parser.parse_args(["--ft-cfg-path", str(tmp_path / "missing.yaml")]), NAMES)
