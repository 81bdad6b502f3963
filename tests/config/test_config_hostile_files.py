"""Issue 22, area config: hostile numbers, files, reserved names, outputs and URLs
(tests/helpers/hostile_files.py generates the cases; each is refused cleanly or held). Then
the promises the cases lean on, checked on their own."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from rocky_vulkan.config import ConfigError, load_config, url_secret
from rocky_vulkan.layer import manifest, reserved
from rocky_vulkan.regularfile import NotReadable, read_regular

from tests.helpers import adversary, hostile_files
from tests.helpers.project import ROOT

CASES = adversary.area_cases("config")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(case):
    adversary.assert_good(case)


def test_the_run_covers_every_class_and_the_issues_examples():
    ids = {c.id for c in CASES}
    assert {c.klass for c in CASES} == {"numbers", "files", "reserved-names", "outputs", "secrets"}
    for example in (
        "config:numbers:selftest.prompt_tokens=400-digits",
        "config:numbers:selftest.prompt_tokens=5000-digits",
        "config:numbers:selftest.prompt_tokens=70-digits",
        "config:files:-c=symlink-loop",
        "config:files:-c=fifo",
        "config:files:-c=dev-zero",
        "config:reserved-names:machine=base",
        "config:reserved-names:machine=debug",
        "config:reserved-names:machine=offline",
        "config:reserved-names:machine=model-licence",
        "config:reserved-names:machine=sstate-mirror",
        "config:reserved-names:machine=rock-5b",
        "config:reserved-names:repo=rocky-vulkan-llama",
        "config:reserved-names:distro=poky",
        "config:outputs:symlinked-config",
        "config:secrets:model.url:user:password@",
    ):
        assert example in ids


def _bounded(schema: dict) -> bool:
    if "const" in schema or "enum" in schema:
        return True
    low = "minimum" in schema or "exclusiveMinimum" in schema
    return low and ("maximum" in schema or "exclusiveMaximum" in schema)


def test_every_number_in_the_schema_is_range_checked():
    schema = json.loads((ROOT / "tools/rocky_vulkan/schema/config.schema.json").read_text())
    found = []

    def walk(node, where):
        if isinstance(node, dict):
            if node.get("type") in ("integer", "number"):
                found.append(where)
                assert _bounded(node), f"{where}: no range"
            for key, value in node.items():
                walk(value, f"{where}/{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}]")

    walk(schema, "")
    assert len(found) >= 15


def test_the_reserved_machine_names_are_the_kas_files_render_writes():
    # From the template tree, not a list: a new kas template's name is reserved with it.
    kas = [t for t in manifest.template_tree() if t.startswith("kas/") and "{" not in t]
    assert len(kas) >= 6
    for template in kas:
        name = template.removeprefix("kas/").removesuffix(".j2").removesuffix(".yml")
        assert reserved.machine_reason(name), name
    assert reserved.machine_reason("model-licence-anything")  # kas/model-licence-{model}.yml
    for fine in ("rock-5-itx", "rock-5b-rocky", "my-base", "rocky-vulkan-llama"):
        assert reserved.machine_reason(fine) is None, fine


def test_the_upstream_names_the_config_warns_of_are_reserved():
    committed = (ROOT / "rocky-vulkan.yaml").read_text()
    assert "meta-rockchip has rock-5b" in committed
    assert "meta-rockchip" in reserved.machine_reason("rock-5b")
    for distro in ("poky", "poky-tiny", "poky-altcfg", "nodistro"):
        assert reserved.distro_reason(distro), distro
    assert reserved.distro_reason("rocky-vulkan") is None
    assert reserved.repo_reason(manifest.PROJECT_REPO)
    assert reserved.repo_reason("meta-rockchip") is None


def test_a_symlinked_config_names_its_own_folder_as_the_project(tmp_path):
    here = hostile_files._project(tmp_path, name="here")
    target = tmp_path / "elsewhere.yaml"
    (here / "rocky-vulkan.yaml").rename(target)
    (here / "rocky-vulkan.yaml").symlink_to(target)
    cfg = load_config(here / "rocky-vulkan.yaml")
    assert cfg.root == here and cfg.path == here / "rocky-vulkan.yaml"


def test_the_committed_tree_lists_every_file_render_makes():
    listed = manifest.recorded_paths((ROOT / manifest.RECORD).read_text())
    on_disk = {
        p.relative_to(ROOT).as_posix()
        for top in manifest.OUTPUT_DIRS
        for p in (ROOT / top).rglob("*")
        if p.is_file()
    }
    assert listed == on_disk


@pytest.mark.parametrize(
    "url",
    [
        "https://huggingface.co/a/b/resolve/0123/m.gguf?download=true",
        "https://github.com/ggml-org/llama.cpp.git",
        "git://git.example.org/x.git",
        "https://example.org/@scope/pkg",
        "not a url ?token=x",
    ],
)
def test_plain_urls_hold_no_secret(url):
    assert url_secret(url) is None


def test_a_refused_secret_is_never_shown(tmp_path):
    project = hostile_files._project(tmp_path)
    path = project / "rocky-vulkan.yaml"
    text = path.read_text().replace(
        "https://huggingface.co/Qwen", "https://me:pw-42@huggingface.co/Qwen", 1
    )
    path.write_text(
        text.replace(
            "https://git.yoctoproject.org/meta-arm",
            "https://git.yoctoproject.org/meta arm?token=pw-42",
        )
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "model.url" in str(err.value) and "repos[3].url" in str(err.value)
    assert "pw-42" not in str(err.value) and "~/.netrc" in str(err.value)


def test_read_regular_reads_up_to_the_limit_and_no_further(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100, "test") == b"x" * 100
    with pytest.raises(NotReadable, match="100 bytes, more than 99; a test file is at most 99"):
        read_regular(path, 99, "test")


def test_read_regular_bounds_a_file_that_claims_no_size():
    # /proc files say st_size 0: the read itself stops at the limit.
    with pytest.raises(NotReadable, match="over 10 bytes"):
        read_regular(Path("/proc/self/status"), 10, "status")


def test_read_regular_never_opens_a_device_or_fifo(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in (
        (fifo, "FIFO"),
        (Path("/dev/zero"), "character device"),
        (tmp_path, "directory"),
    ):
        with pytest.raises(NotReadable, match=kind) as err:
            read_regular(path, 10, "test")
        assert str(err.value).startswith(f"{path}: ")
