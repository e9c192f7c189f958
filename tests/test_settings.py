"""Settings: environment variables over the ROCM_VIT_CONFIG YAML file over defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

import rocm_vit.settings as settings_module
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
        "sglang_blocks": "rocm-vit",
        "use_aiter": False,
        "vit_cuda_graph": False,
        "graph_cache_capacity": 32,
        "graph_min_hits": 2,
        "graph_max_tokens": None,
        "graph_memory_budget_mb": None,
        "graph_padding": True,
        "graph_capture_buckets": True,
    }


def test_a_removed_setting_warns_once_and_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch
) -> None:
    """SGLANG_VIT_CUDA_GRAPH_DEFER_CAPTURES of earlier releases: a YAML file that names it still loads."""
    monkeypatch.setattr(settings_module, "_warned_removed", set())
    environ = {**_yaml(tmp_path, "graph_defer_captures: true\ngraph_min_hits: 3\n")}
    environ["SGLANG_VIT_CUDA_GRAPH_DEFER_CAPTURES"] = "0"
    assert load_settings(environ) == load_settings(environ) == Settings(graph_min_hits=3)
    assert caplog.text.count("SGLANG_VIT_CUDA_GRAPH_DEFER_CAPTURES is no longer used") == 1


def test_every_setting_has_an_environment_variable() -> None:
    assert set(ENV_NAMES) == set(Settings().as_dict())


def test_unrelated_environment_is_ignored() -> None:
    assert load_settings({"PATH": "/bin", "SGLANG_OTHER": "1", "ROCM_VIT_UNKNOWN": "x"}) == Settings()


# (text, SGLANG_USE_AITER as get_bool_env_var reads it, SGLANG_VIT_ENABLE_CUDA_GRAPH as EnvBool reads it,
# ROCM_VIT_DISABLE as rocm-vit reads it), from sglang 0.5.23's sources.
BOOLEANS = [
    ("1", True, True, True),
    ("true", True, True, True),
    ("TRUE", True, True, True),
    ("yes", False, True, True),
    ("y", False, True, None),
    ("on", False, False, True),
    ("0", False, False, False),
    ("false", False, False, False),
    ("no", False, False, False),
    ("off", False, False, False),
    ("", False, False, False),
    ("maybe", False, False, None),
]


@pytest.mark.parametrize(("text", "use_aiter", "vit_cuda_graph", "disable"), BOOLEANS)
def test_booleans_read_as_sglang_reads_its_own_and_strictly_for_rocm_vit(
    text: str, use_aiter: bool, vit_cuda_graph: bool, disable: bool | None
) -> None:
    settings = load_settings({"SGLANG_USE_AITER": text, "SGLANG_VIT_ENABLE_CUDA_GRAPH": text})
    assert (settings.use_aiter, settings.vit_cuda_graph) == (use_aiter, vit_cuda_graph)
    if disable is None:
        with pytest.raises(ValueError, match=f"ROCM_VIT_DISABLE = {text!r} is not a boolean"):
            load_settings({"ROCM_VIT_DISABLE": text})
    else:
        assert load_settings({"ROCM_VIT_DISABLE": text}).disable is disable


def test_unknown_sglang_boolean_warns_once_per_variable(caplog: pytest.LogCaptureFixture) -> None:
    settings_module._warned_sglang_booleans.clear()
    for _ in range(3):
        assert load_settings({"SGLANG_USE_AITER": "enabled"}).use_aiter is False
    assert caplog.text.count("SGLANG_USE_AITER = 'enabled' is not one of") == 1


def test_strings_are_lowercased_and_empty_means_choose_per_platform() -> None:
    settings = load_settings({"ROCM_VIT_ATTENTION_BACKEND": " SDPA ", "ROCM_VIT_ROTARY": "Native"})
    assert (settings.attention_backend, settings.rotary) == ("sdpa", "native")
    settings = load_settings({"ROCM_VIT_ATTENTION_BACKEND": "", "ROCM_VIT_ROTARY": "  "})
    assert (settings.attention_backend, settings.rotary) == (None, None)


def test_fused_ops_can_be_turned_off() -> None:
    assert load_settings({"ROCM_VIT_FUSED_OPS": "0"}).fused_ops is False
    assert load_settings({"ROCM_VIT_FUSED_OPS": "1"}).fused_ops is True


def test_sglang_blocks_choose_rocm_vits_glue_or_sglangs_blocks() -> None:
    assert load_settings({"ROCM_VIT_SGLANG_BLOCKS": " SGLang "}).sglang_blocks == "sglang"
    assert load_settings({"ROCM_VIT_SGLANG_BLOCKS": "rocm-vit"}).sglang_blocks == "rocm-vit"


def test_graph_cache_settings_parse_integers() -> None:
    assert load_settings({"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": " 8 "}).graph_cache_capacity == 8
    assert load_settings({"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": "0"}).graph_cache_capacity == 0
    assert load_settings({"SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS": "0"}).graph_max_tokens == 0  # no call captured
    settings = load_settings(
        {
            "SGLANG_VIT_CUDA_GRAPH_MIN_HITS": "3",
            "SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS": "2048",
            "SGLANG_VIT_CUDA_GRAPH_MEMORY_BUDGET_MB": "512",
        }
    )
    assert (settings.graph_min_hits, settings.graph_max_tokens, settings.graph_memory_budget_mb) == (3, 2048, 512)
    assert load_settings({"SGLANG_VIT_CUDA_GRAPH_MEMORY_BUDGET_MB": ""}).graph_memory_budget_mb is None


@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    [
        ("ROCM_VIT_DISABLE", "2", "is not a boolean"),
        ("ROCM_VIT_FUSED_OPS", "enabled", "is not a boolean"),
        ("SGLANG_VIT_CUDA_GRAPH_MEMORY_BUDGET_MB", "1GB", "is not an integer"),
        ("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "lots", "is not an integer"),
        ("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "1.5", "is not an integer"),
        ("SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY", "-1", "must be >= 0"),
        ("SGLANG_VIT_CUDA_GRAPH_MAX_TOKENS", "-1", "must be >= 0"),
        ("ROCM_VIT_SGLANG_BLOCKS", "fused", "is not one of rocm-vit, sglang"),
        ("ROCM_VIT_SGLANG_BLOCKS", "", "is not one of rocm-vit, sglang"),
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
