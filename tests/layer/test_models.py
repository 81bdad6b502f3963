"""models: each entry renders a recipe that fetches and checks it like rocky-model, the image
installs the one serve.model names, and the board's server settings point at it."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.host import build
from rocky_vulkan.layer import lint, manifest

from tests.helpers.models import model, write_config

LLM = "meta-rocky-vulkan/meta-rocky-vulkan/recipes-llm"
TINY = f"{LLM}/rocky-model-tiny/rocky-model-tiny_1.0.bb"
TINY_NOTICE = f"{LLM}/rocky-model-tiny/files/MODEL-LICENSE"
IMAGE = "meta-rocky-vulkan/meta-rocky-vulkan/recipes-core/images/rocky-vulkan-image.bb"
BOARD = f"{LLM}/rocky-board/files/config.json"
APACHE = model(name="small", filename="small.gguf", license="Apache-2.0", license_flags="")


def render(dest: Path, models: list[dict], serve: str = "reference") -> dict[str, str]:
    cfg = load_config(write_config(dest, models, serve))
    return {k: v.decode() for k, v in manifest.render_files(cfg).items()}


def var(text: str, name: str) -> str:
    match = re.search(rf'^{re.escape(name)} = "(.*)"$', text, re.M)
    assert match, f"{name} not set"
    return match.group(1)


def test_an_extra_model_renders_a_checked_recipe_with_its_licence(tmp_path):
    files = render(tmp_path, [model()], serve="tiny")
    recipe, notice = files[TINY], files[TINY_NOTICE]
    assert f"{model()['url']};downloadfilename=tiny-q8_0.gguf" in recipe
    assert var(recipe, "SRC_URI[sha256sum]") == "ab" * 32 and "SKIP_RECIPE" not in recipe
    assert var(recipe, "LICENSE") == "Llama-3.2-Community"
    assert var(recipe, "HOMEPAGE") == "https://huggingface.co/example/tiny-GGUF"
    assert var(recipe, "LICENSE_FLAGS") == "llama-community"
    details = var(recipe, "LICENSE_FLAGS_DETAILS[llama-community]")
    assert "LICENSE_FLAGS_ACCEPTED += 'llama-community'" in details
    assert "kas/model-licence-tiny.yml" in details
    md5 = re.search(r"MODEL-LICENSE;md5=([0-9a-f]{32})", recipe).group(1)
    assert hashlib.md5(notice.encode()).hexdigest() == md5
    assert "Llama-3.2-Community" in notice and model()["url"] in notice
    # Installed beside the reference model, where the board looks for models.
    assert "${D}${datadir}/rocky-models/tiny-q8_0.gguf" in recipe
    fragment = yaml.safe_load(files["kas/model-licence-tiny.yml"])
    assert fragment["local_conf_header"] == {
        "model-licence-tiny": 'LICENSE_FLAGS_ACCEPTED:append = " llama-community"\n'
    }


def test_a_null_sha256_skips_the_recipe_naming_the_fix(tmp_path):
    recipe = render(tmp_path, [model(sha256=None)])[TINY]
    assert "SRC_URI[sha256sum]" not in recipe
    skip = var(recipe, "SKIP_RECIPE[rocky-model-tiny]")
    assert "sha256 null" in skip and "`rocky-vulkan model fetch tiny`" in skip
    assert "`rocky-vulkan render`" in skip


def test_a_permissive_licence_needs_no_flag_and_no_fragment(tmp_path):
    files = render(tmp_path, [APACHE], serve="small")
    recipe = files[f"{LLM}/rocky-model-small/rocky-model-small_1.0.bb"]
    assert var(recipe, "LICENSE") == "Apache-2.0" and "LICENSE_FLAGS" not in recipe
    assert not any(path.startswith("kas/model-licence-") for path in files)
    image = files[IMAGE]
    assert "    rocky-model-small \\\n" in image and "ROCKY_SERVE_" not in image


def test_the_image_installs_and_checks_the_served_model_only(tmp_path):
    files = render(tmp_path, [model(), APACHE], serve="tiny")
    image = files[IMAGE]
    assert "    rocky-model \\\n    rocky-model-tiny \\\n" in image
    assert "rocky-model-small" not in image
    assert var(image, "ROCKY_SERVE_LICENSE_FLAG") == "llama-community"
    assert "kas/model-licence-tiny.yml" in var(image, "ROCKY_SERVE_TERMS_MSG")
    assert "ROCKY_SERVE_TERMS_MSG" in var(image, "SKIP_RECIPE[rocky-vulkan-image]")
    # Both recipes exist; the one not served is there to build or add by hand.
    assert f"{LLM}/rocky-model-small/rocky-model-small_1.0.bb" in files
    reference = render(tmp_path / "ref", [model()])[IMAGE]
    assert "rocky-model-tiny" not in reference and "ROCKY_SERVE_" not in reference


def test_the_board_serves_the_chosen_model_and_tests_the_reference(tmp_path):
    cfg = load_config(write_config(tmp_path, [model()], serve="tiny"))
    board = json.loads(render(tmp_path, [model()], serve="tiny")[BOARD])
    assert board["serve_model_path"] == "/usr/share/rocky-models/tiny-q8_0.gguf"
    assert board["serve_model_name"] == "tiny"
    assert board["model_path"] == f"/usr/share/rocky-models/{cfg.model.filename}"
    assert board["model_sha256"] == cfg.model.sha256
    default = json.loads(render(tmp_path / "ref", [model()])[BOARD])
    assert default["serve_model_path"] == default["model_path"]
    assert default["serve_model_name"] == "reference"


def test_the_layer_readme_lists_the_models(tmp_path):
    files = render(tmp_path, [model(), APACHE], serve="tiny")
    readme = files["meta-rocky-vulkan/meta-rocky-vulkan/README.md"]
    assert "- `rocky-model-tiny`: tiny from `models:`" in readme
    assert "(kas/model-licence-tiny.yml); the server loads it." in readme
    assert "- `rocky-model-small`: small from `models:`, LICENSE `Apache-2.0`." in readme


def test_a_rendered_project_with_extra_models_is_lint_clean(project, capsys):
    """The real `rocky-vulkan lint` (oelint-adv --release wrynose, kas's schema) on a project
    with a served model (licence flag, no sha256 yet) and a pinned Apache-2.0 one."""
    path = write_config(project, [model(sha256=None), APACHE], serve="tiny")
    assert main(["--config", str(path), "render"]) == 0
    assert (project / TINY).is_file() and (project / "kas/model-licence-tiny.yml").is_file()
    assert "model-licence-tiny" in build.available_fragments(load_config(path))
    results = lint.run_checks(load_config(path))
    assert [(r.name, r.findings, r.crashed) for r in results if r.status != "ok"] == []
    assert main(["--config", str(path), "lint"]) == 0
    # Dropping the model drops its recipe and fragment from the tree.
    path = write_config(project, [])
    assert main(["--config", str(path), "render"]) == 0
    assert not (project / TINY).exists() and not (project / "kas/model-licence-tiny.yml").exists()


@pytest.mark.needs_bitbake
def test_bitbake_picks_the_licence_text_and_skips_the_image_until_accepted(tmp_path):
    """bitbake's own parser and data store on the rendered lines: NO_GENERIC_LICENSE only for
    a licence without a common text, and the image's skip message until both flags are in."""
    sys.path.insert(0, str(Path(os.environ["ROCKY_BITBAKE_DIR"]) / "lib"))
    import bb.data  # noqa: E402 - from the checkout named above
    import bb.parse  # noqa: E402

    common = tmp_path / "common-licenses"
    common.mkdir()
    (common / "Apache-2.0").write_text("Apache License\n")
    files = render(tmp_path / "p", [model(), APACHE], serve="tiny")

    def parsed(lines: list[str], **values: str):
        d = bb.data.init()
        d.setVar("COMMON_LICENSE_DIR", str(common))
        for key, value in values.items():
            d.setVar(key, value)
        conf = tmp_path / "lines.conf"
        conf.write_text("\n".join(lines) + "\n")
        bb.parse.handle(str(conf), d, True)
        return d

    for recipe, lic, want in (
        (files[TINY], "Llama-3.2-Community", "MODEL-LICENSE"),
        (files[f"{LLM}/rocky-model-small/rocky-model-small_1.0.bb"], "Apache-2.0", ""),
    ):
        line = next(x for x in recipe.splitlines() if x.startswith("NO_GENERIC_LICENSE["))
        d = parsed([line], LICENSE=lic)
        assert d.getVarFlag("NO_GENERIC_LICENSE", lic) == want

    image = files[IMAGE]
    lines = [
        x
        for x in image.splitlines()
        if re.match(r"(ROCKY_(MODEL|SERVE)_|ROCKY_WRONG|SKIP_RECIPE)", x)
    ]
    for accepted, want in (
        ("", "the model's licence is not accepted"),
        ("qwen-research", "the licence of tiny (serve.model) is not accepted"),
        ("qwen-research llama-community_rocky-model-tiny", ""),
        ("qwen-research llama-community", ""),
    ):
        d = parsed(lines, DISTRO="rocky-vulkan", LICENSE_FLAGS_ACCEPTED=accepted)
        skip = d.getVarFlag("SKIP_RECIPE", "rocky-vulkan-image")
        assert skip.startswith(want) and bool(skip) == bool(want), (accepted, skip)


def test_the_image_installs_the_draft_model_and_the_board_measures_it(tmp_path):
    cfg = load_config(write_config(tmp_path, [APACHE], draft="small"))
    files = {k: v.decode() for k, v in manifest.render_files(cfg).items()}
    assert "    rocky-model \\\n    rocky-model-small \\\n" in files[IMAGE]
    board = json.loads(files[BOARD])
    assert board["spec_draft_model_path"] == "/usr/share/rocky-models/small.gguf"
    plain = json.loads(render(tmp_path / "plain", [APACHE])[BOARD])
    assert plain["spec_draft_model_path"] == ""
