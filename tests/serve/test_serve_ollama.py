"""The Ollama-compatible API for real (issue 31, point 3): rocky-llm-ollama.service's ExecStart
run here in front of rocky-llm.service's router (the real llama-server), reached with the
official `ollama` Python client over HTTPS with the board's certificate pinned and its API key.

The served model is the tiny test model with its byte tokens typed as text (testmodel's
`text_only`): an Ollama client cannot ban tokens, and a lone byte token would make b9101's chat
parser fail the request (see tests/helpers/serve.py). Pulls come from a loopback HTTP server
that a script drives (tests/helpers/fetch_server.py).
"""

from __future__ import annotations

import hashlib
import http.client
import json

import httpx
import ollama
import openai
import pytest

from tests.helpers.fetch_server import RawServer, file_script, respond
from tests.helpers.llama_bin import BIN_DIR
from tests.helpers.serve import free_port, start_ollama_unit, unit_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600), pytest.mark.needs_llama_bin]

PROMPT = [{"role": "user", "content": "Say hello."}]
GREEDY = {"temperature": 0, "seed": 7, "num_predict": 12}


def text_model(tmp_path_factory, name: str, seed: int):
    from rocky_vulkan.llama.testmodel import write_preset

    path = tmp_path_factory.mktemp(name) / f"{name}.gguf"
    return write_preset("tiny", path, seed=seed, text_only=True)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    model = text_model(tmp_path_factory, "tiny-text", 1)
    port = free_port()
    with unit_server(tmp_path_factory, "ollama", BIN_DIR, model, ollama_port=port) as (
        server,
        info,
        tmp,
    ):
        proxy = start_ollama_unit(server, info, port)
        try:
            yield server, proxy, info, model
        finally:
            proxy.stop()
            print(f"ollama log: {proxy.log}")


def make_client(served, key: str | None = "") -> ollama.Client:
    server, proxy, _, _ = served
    key = server.api_key if key == "" else key
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return ollama.Client(
        host=f"https://127.0.0.1:{proxy.port}", headers=headers, verify=server.ctx, timeout=300
    )


@pytest.fixture(scope="module")
def client(served):
    return make_client(served)


def raw(served, method: str, path: str, body: dict | None = None, key: str | None = ""):
    """httpx straight at the proxy: for what the ollama client cannot send."""
    server, proxy, _, _ = served
    key = server.api_key if key == "" else key
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    with httpx.Client(verify=server.ctx, timeout=300) as c:
        return c.request(
            method, f"https://127.0.0.1:{proxy.port}{path}", json=body, headers=headers
        )


def openai_client(served, port: int, key: str | None = None) -> openai.OpenAI:
    """The official client on `port` (the router's, or the Ollama proxy's), pinned."""
    server = served[0]
    return openai.OpenAI(
        base_url=f"https://127.0.0.1:{port}/v1",
        api_key=server.api_key if key is None else key,
        http_client=openai.DefaultHttpxClient(verify=server.ctx),
        max_retries=0,
    )


def openai_chat(served, max_tokens: int, model: str = "reference") -> str:
    with openai_client(served, served[0].port) as c:
        out = c.chat.completions.create(
            model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0, seed=7
        )
    return out.choices[0].message.content


def test_the_root_answers_as_ollama_does_and_everything_else_needs_the_key(served):
    assert raw(served, "GET", "/", key=None).text == "Ollama is running"
    for key in (None, "wrong-key"):
        with pytest.raises(ollama.ResponseError) as err:
            make_client(served, key).list()
        assert err.value.status_code == 401
        assert "API key" in err.value.error
    assert raw(served, "GET", "/api/version").json()["version"].count(".") == 2


def test_tags_list_the_store_with_the_gguf_details(client, served):
    model = served[3]
    (tag,) = client.list().models
    assert tag.model == "reference:latest"
    assert tag.size == model.stat().st_size
    assert tag.details.format == "gguf" and tag.details.family == "llama"
    assert tag.details.quantization_level == "F16"


def test_show_reads_the_gguf_header(client):
    shown = client.show("reference")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 4096
    assert shown.details.format == "gguf"
    assert shown.capabilities == ["completion"]


def test_chat_matches_the_openai_api_streamed_or_not(client, served):
    once = client.chat("reference", messages=PROMPT, options=GREEDY)
    assert once.done and once.message.role == "assistant"
    assert 0 < once.eval_count <= GREEDY["num_predict"], once
    assert once.prompt_eval_count > 0 and once.eval_duration > 0
    assert once.done_reason in ("stop", "length")
    # The same greedy request through the router's OpenAI API: the same text.
    assert once.message.content == openai_chat(served, GREEDY["num_predict"])
    parts = list(client.chat("reference", messages=PROMPT, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == once.message.content
    assert parts[-1].eval_count == once.eval_count


def test_generate_streamed_or_not_and_raw(client):
    once = client.generate("reference", prompt="Say hello.", options=GREEDY)
    assert once.done and once.response and once.eval_count > 0
    parts = list(client.generate("reference", prompt="Say hello.", options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == once.response
    raw_once = client.generate("reference:latest", prompt="Once upon", raw=True, options=GREEDY)
    assert raw_once.done and raw_once.eval_count > 0
    # An empty prompt loads the model and answers done, as Ollama does.
    loaded = client.generate("reference", prompt="")
    assert loaded.done and loaded.done_reason == "load"


def test_ps_names_the_loaded_model(client):
    assert [m.model for m in client.ps().models] == ["reference:latest"]


def test_keep_alive_0_unloads_and_an_empty_request_loads_again(client):
    """Open WebUI's unload button: an empty generate with keep_alive 0."""
    gone = client.generate("reference", prompt="", keep_alive=0)
    assert gone.done and gone.done_reason == "unload"
    assert client.ps().models == []
    back = client.chat("reference", messages=[])
    assert back.done and back.done_reason == "load"
    assert [m.model for m in client.ps().models] == ["reference:latest"]


def test_a_model_that_is_not_there_is_404_and_the_api_keeps_serving(client):
    for call in (
        lambda: client.chat("no-such-model", messages=PROMPT),
        lambda: client.show("no-such-model"),
        lambda: client.generate("bad name/..", prompt="x"),
    ):
        with pytest.raises(ollama.ResponseError) as err:
            call()
        assert err.value.status_code == 404 and "not found" in err.value.error
    assert client.chat("reference", messages=PROMPT, options=GREEDY).done


def test_unknown_fields_are_ignored_and_logged_wrong_types_are_400(served):
    _, proxy, _, _ = served
    body = {"model": "reference", "messages": PROMPT, "stream": False, "bogus_field": [1],
            "options": {**GREEDY, "num_ctx": 99999, "mystery": True}}  # fmt: skip
    res = raw(served, "POST", "/api/chat", body)
    assert res.status_code == 200 and res.json()["done"], res.text
    assert "/api/chat: ignored fields: bogus_field" in proxy.tail()
    # LangChain's community classes send every option, the unset ones as null: Ollama skips them.
    nulls = {"temperature": None, "top_p": None, "stop": None, "mirostat": None, "seed": 7}
    res = raw(served, "POST", "/api/chat", {**body, "options": {**nulls, "num_predict": 4}})
    assert res.status_code == 200 and res.json()["done"], res.text
    for bad, why in (
        ({"model": 5, "messages": PROMPT}, "model must be a string"),
        ({"model": "reference", "messages": "hi"}, "messages must be a list"),
        ({"model": "reference", "messages": [{"role": "root", "content": "x"}]}, "role must be"),
        ({"model": "reference", "messages": PROMPT, "options": {"temperature": "hot"}},
         "options.temperature must be a number"),
    ):  # fmt: skip
        res = raw(served, "POST", "/api/chat", bad)
        assert res.status_code == 400 and why in res.json()["error"], res.text
    server, proxy, _, _ = served
    with httpx.Client(verify=server.ctx) as c:
        res = c.post(
            f"https://127.0.0.1:{proxy.port}/api/chat", content=b"{not json",
            headers={"Authorization": f"Bearer {server.api_key}"},
        )  # fmt: skip
    assert res.status_code == 400 and "not valid JSON" in res.json()["error"]


def test_the_ollama_client_pull_is_told_what_a_checked_pull_needs(client):
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("qwen2.5:0.5b")
    assert err.value.status_code == 400
    assert "url, sha256, license" in err.value.error and "rocky-llm pull" in err.value.error


def _stream(res: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in res.text.splitlines() if line.strip()]


def test_pull_checks_the_file_serves_it_by_name_then_delete(client, served, tmp_path_factory):
    data = text_model(tmp_path_factory, "second", 2).read_bytes()
    good = hashlib.sha256(data).hexdigest()
    with RawServer(file_script(data, cut_first_at=len(data) // 3)) as srv:
        body = {"model": "second", "url": srv.url, "license": "Apache-2.0"}
        # A wrong sha256: an error line, nothing added.
        lines = _stream(raw(served, "POST", "/api/pull", {**body, "sha256": "0" * 64}))
        assert "sha256" in lines[-1]["error"], lines[-1]
        assert [m.model for m in client.list().models] == ["reference:latest"]
        # The right one: cut once, resumed, checked, offered.
        lines = _stream(raw(served, "POST", "/api/pull", {**body, "sha256": good}))
        assert lines[0] == {"status": "pulling manifest"} and lines[-1] == {"status": "success"}
        done = [x for x in lines if "completed" in x]
        assert done and done[-1]["completed"] == done[-1]["total"] == len(data)
        assert any(r.headers.get("range") for r in srv.requests), "the cut pull did not resume"
    names = sorted(m.model for m in client.list().models)
    assert names == ["reference:latest", "second:latest"]
    answer = client.chat("second", messages=PROMPT, options=GREEDY)
    assert answer.done and answer.message.content == openai_chat(
        served, GREEDY["num_predict"], model="second"
    )
    assert client.chat("reference", messages=PROMPT, options=GREEDY).done
    client.delete("second")
    assert [m.model for m in client.list().models] == ["reference:latest"]
    with pytest.raises(ollama.ResponseError) as err:
        client.chat("second", messages=PROMPT)
    assert err.value.status_code == 404
    # The image's models are not the store's to delete.
    res = raw(served, "DELETE", "/api/delete", {"model": "reference"})
    assert res.status_code == 400, res.text
    assert client.chat("reference", messages=PROMPT, options=GREEDY).done


def test_a_hostile_file_behind_a_right_sha256_is_refused(client, served, tmp_path_factory):
    bad = b"GGUF" + b"\xff" * 4000  # a GGUF magic with an impossible version and header
    sha = hashlib.sha256(bad).hexdigest()
    with RawServer(lambda n, req, srv: respond(srv, 200, [], bad)) as srv:
        res = raw(served, "POST", "/api/pull", {"model": "evil", "url": srv.url, "sha256": sha,
                                                "license": "x", "stream": False})  # fmt: skip
    assert res.status_code == 400 and "GGUF" in res.json()["error"], res.text
    assert [m.model for m in client.list().models] == ["reference:latest"]
    store = served[2]["config"].parent / "models"
    leftovers = [p.name for p in store.rglob("*") if p.is_file() and p.suffix != ".lock"]
    assert leftovers == [], leftovers


def test_the_openai_api_answers_on_the_ollama_port_too(served):
    """Ollama serves /v1 on 11434; clients pointed there (LangChain's ChatOpenAI, Continue)."""
    _, proxy, _, _ = served
    with openai_client(served, proxy.port) as c:
        assert "reference" in [m.id for m in c.models.list()]
        once = c.chat.completions.create(
            model="reference:latest", messages=PROMPT, max_tokens=4, temperature=0, seed=7
        )
        assert once.choices[0].message.role == "assistant" and once.usage.completion_tokens > 0
        pieces = c.chat.completions.create(
            model="reference", messages=PROMPT, max_tokens=4, temperature=0, seed=7, stream=True
        )
        streamed = "".join(p.choices[0].delta.content or "" for p in pieces if p.choices)
        assert streamed == once.choices[0].message.content
    with openai_client(served, proxy.port, key="wrong") as stranger:
        with pytest.raises(openai.AuthenticationError):
            stranger.models.list()


def test_plain_http_on_the_tls_port_is_told_to_use_https(served):
    """Ollama's default address is http://host:11434: such a client gets a readable answer."""
    _, proxy, _, _ = served
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
    try:
        conn.request("GET", "/api/tags")
        res = conn.getresponse()
        assert res.status == 400
        assert "HTTPS only" in json.loads(res.read())["error"]
    finally:
        conn.close()
    assert raw(served, "GET", "/api/version").status_code == 200  # TLS clients still served
