"""/api/show's capabilities and template from the GGUF's own keys (rocky_selftest.ollama_api):
the clients that offer tools or thinking by capability (Home Assistant, Open WebUI) read them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rocky_selftest.model_store import Model
from rocky_selftest.ollama_api import capabilities, metadata

gguf = pytest.importorskip("gguf")

# Shaped like the templates of real models (written here, not copied): Qwen2.5's takes tools,
# Qwen3's also thinks, a plain one does neither.
TOOLS = "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
THINKS = TOOLS + "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
PLAIN = "{% for m in messages %}{{ m.content }}{% endfor %}"


def model(tmp_path: Path, arch: str = "llama", template: str | None = None,
          pooling: int | None = None) -> Model:  # fmt: skip
    path = tmp_path / f"{arch}-{abs(hash((template, pooling)))}.gguf"
    writer = gguf.GGUFWriter(str(path), arch)
    if template is not None:
        writer.add_chat_template(template)
    if pooling is not None:
        writer.add_uint32(f"{arch}.pooling_type", pooling)
    writer.add_tensor("w", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Model("m", str(path), path.stat().st_size, None, "test", "MIT")


@pytest.mark.parametrize(
    ("template", "want"),
    [
        (None, ["completion"]),
        (PLAIN, ["completion"]),
        (TOOLS, ["completion", "tools"]),
        (THINKS, ["completion", "tools", "thinking"]),
    ],
)
def test_capabilities_follow_the_chat_template(tmp_path, template, want):
    meta = metadata(model(tmp_path, template=template))
    assert capabilities(meta) == want
    assert meta.get("tokenizer.chat_template") == template


def test_an_embedding_model_only_embeds(tmp_path):
    meta = metadata(model(tmp_path, arch="bert", template=TOOLS, pooling=1))
    assert capabilities(meta) == ["embedding"]


def test_an_unreadable_file_claims_no_more_than_completion(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 64)
    assert capabilities(metadata(Model("b", str(bad), 68, None, "test", "MIT"))) == ["completion"]
