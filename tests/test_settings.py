"""Settings: environment variables over the ROCM_VIT_CONFIG YAML file over defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from rocm_vit.settings import CONFIG_ENV, ENV_NAMES, Settings, load_settings


def _yaml(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "rocm-vit.yaml"
    path.write_text(text)
    return {CONFIG_ENV: str(path)}


def test_defaults_without_environment() -> None:
    settings = load_settings({})
    assert settings == Settings()
    assert settings.as_dict() == {
        "attention_backend": None,
        "rotary": None,
        "fused_ops": True,
        "disable": False,
        "use_aiter": False,
        "vit_cuda_graph": False,
        "graph_cache_capacity": 32,
    }


def test_every_setting_has_an_environment_variable() -> None:
    assert set(ENV_NAMES) == set(Settings().as_dict())


def test_unrelated_environment_is_ignored() -> None:
    assert load_settings({"PATH": "/bin", "SGLANG_OTHER": "1", "ROCM_VIT_UNKNOWN": "x"}) == Settings()


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "on", " On "])
def test_true_values(text: str) -> None:
    settings = load_settings({"SGLANG_USE_AITER": text, "SGLANG_VIT_ENABLE_CUDA_GRAPH": text, "ROCM_VIT_DISABLE": text})
    assert (settings.use_aiter, settings.vit_cuda_graph, settings.disable) == (True, True, True)


@pytest.mark.parametrize("text", ["0", "false", "False", "no", "off", ""])
def test_false_values(text: str) -> None:
    settings = load_settings({"SGLANG_USE_AITER": text, "SGLANG_VIT_ENABLE_CUDA_GRAPH": text, "ROCM_VIT_DISABLE": text})
    assert (settings.use_aiter, settings.vit_cuda_graph, settings.disable) == (False, False, False)


def test_strings_are_lowercased_and_empty_means_choose_per_platform() -> None:
    settings = load_settings({"ROCM_VIT_ATTENTION_BACKEND": " SDPA ", "ROCM_VIT_ROTARY": "Native"})
    assert (settings.attention_backend, settings.rotary) == ("sdpa", "native")
    settings = load_settings({"ROCM_VIT_ATTENTION_BACKEND": "", "ROCM_VIT_ROTARY": "  "})
    assert (settings.attention_backend, settings.rotary) == (None, None)


def test_fused_ops_can_be_turned_off() -> None:
    assert load_settings({"ROCM_VIT_FUSED_OPS": "0"}).fused_ops is False
    assert load_settings({"ROCM_VIT_FUSED_OPS": "1"}).fused_ops is True


def test_graph_cache_capacity_parses_an_integer() -> None:
    assert load_settings({"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": " 8 "}).graph_cache_capacity == 8
    assert load_settings({"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": "0"}).graph_cache_capacity == 0


@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    [
        ("SGLANG_USE_AITER", "maybe", "is not a boolean"),
        ("ROCM_VIT_DISABLE", "2", "is not a boolean"),
        ("SGLANG_VIT_ENABLE_CUDA_GRAPH", "enabled", "is not a boolean"),
        ("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "lots", "is not an integer"),
        ("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "1.5", "is not an integer"),
        ("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "-1", "must be >= 0"),
    ],
)
def test_bad_environment_values_raise_naming_the_variable(name: str, value: str, complaint: str) -> None:
    with pytest.raises(ValueError) as raised:
        load_settings({name: value})
    assert f"{name} = {value!r} {complaint}" in str(raised.value)


def test_yaml_file_sets_values(tmp_path: Path) -> None:
    environ = _yaml(
        tmp_path,
        "attention_backend: sdpa\nrotary: native\ndisable: true\nuse_aiter: yes\n"
        "vit_cuda_graph: on\ngraph_cache_capacity: 4\n",
    )
    assert load_settings(environ) == Settings(
        attention_backend="sdpa",
        rotary="native",
        disable=True,
        use_aiter=True,
        vit_cuda_graph=True,
        graph_cache_capacity=4,
    )


def test_environment_wins_over_yaml(tmp_path: Path) -> None:
    environ = _yaml(tmp_path, "use_aiter: true\ngraph_cache_capacity: 4\nrotary: native\n")
    environ |= {"SGLANG_USE_AITER": "0", "SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": "16"}
    settings = load_settings(environ)
    assert (settings.use_aiter, settings.graph_cache_capacity) == (False, 16)
    assert settings.rotary == "native"  # not set in the environment: the file's value stands


def test_empty_yaml_file_gives_defaults(tmp_path: Path) -> None:
    assert load_settings(_yaml(tmp_path, "# nothing set\n")) == Settings()


def test_yaml_unknown_key_is_refused_naming_it(tmp_path: Path) -> None:
    environ = _yaml(tmp_path, "use_aiter: true\ngraph_capacity: 4\n")
    with pytest.raises(ValueError, match=r"ROCM_VIT_CONFIG = '.*rocm-vit\.yaml' has unknown keys \['graph_capacity'\]"):
        load_settings(environ)


def test_yaml_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"ROCM_VIT_CONFIG = '.*' must hold a mapping, got list"):
        load_settings(_yaml(tmp_path, "- use_aiter\n"))


def test_missing_yaml_file_is_refused_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ValueError, match=rf"ROCM_VIT_CONFIG = '{missing}' cannot be read"):
        load_settings({CONFIG_ENV: str(missing)})


def test_bad_yaml_value_raises_naming_the_setting_and_value(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY = 'many' is not an integer"):
        load_settings(_yaml(tmp_path, "graph_cache_capacity: many\n"))


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "7")
    assert load_settings().graph_cache_capacity == 7
