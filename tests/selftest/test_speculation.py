"""The decode choice from a `speculative` section (rocky_selftest.speculation) and what the server
gets from it: flags, presets, the router's memory footprint. The sections here are made up (a
pure function over numbers); the real measurement: test_selftest_speculative_real.py."""

from __future__ import annotations

import math

import pytest
from rocky_selftest.speculation import GOAL, WIN_MIN, choose, goal, mode_flags, speedups

MODEL = "/var/lib/rocky-vulkan/models/reference.gguf"


def entry(ms: float, accepted: int = 10, status: str = "PASS") -> dict:
    runs = [{"request": r, "status": "PASS", "predicted_ms": ms / 2, "draft_n": 2 * accepted,
             "draft_n_accepted": accepted} for r in ("chat", "repeat")]  # fmt: skip
    return {"status": status, "runs": runs}


def section(**modes) -> dict:
    return {
        "model": MODEL,
        "draft_model": None,
        "requests": [{"name": "chat"}, {"name": "repeat"}],
        "modes": {"off": entry(300.0, accepted=0), **modes},
    }


def test_the_fastest_mode_that_took_drafts_wins():
    sec = section(**{"ngram-simple": entry(250.0), "ngram-mod": entry(200.0)})
    value, why = choose(sec, MODEL)
    assert value == {"mode": "ngram-mod"} and why.startswith("ngram-mod: 1.50x plain decode")
    assert speedups(sec)[0] == pytest.approx({"ngram-simple": 1.2, "ngram-mod": 1.5})


def test_a_mode_that_took_no_drafts_never_wins_whatever_its_time():
    sec = section(**{"ngram-mod": entry(200.0, accepted=0), "ngram-simple": entry(295.0)})
    value, why = choose(sec, MODEL)
    assert value is None and "took drafts" in why and "(0 drafts taken)" in why


def test_below_the_win_margin_is_plain_decode():
    sec = section(**{"ngram-mod": entry(300.0 / (WIN_MIN - 0.01))})
    assert choose(sec, MODEL)[0] is None
    sec = section(**{"ngram-mod": entry(300.0 / (WIN_MIN + 0.01))})
    assert choose(sec, MODEL)[0] == {"mode": "ngram-mod"}


def test_a_failed_or_partial_mode_is_left_out():
    broken = entry(100.0, status="FAIL")
    partial = entry(100.0)
    partial["runs"] = partial["runs"][:1]  # the repeat request missing
    sec = section(**{"ngram-mod": broken, "ngram-simple": partial})
    value, why = choose(sec, MODEL)
    assert value is None and "no speculative mode was measured in full" in why


def test_the_draft_model_must_still_be_there(tmp_path):
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    sec = {**section(draft=entry(150.0)), "draft_model": str(draft)}
    assert choose(sec, MODEL)[0] == {"mode": "draft", "draft_model": str(draft)}
    draft.unlink()
    value, why = choose(sec, MODEL)
    assert value is None and "not a file any more" in why


def test_only_the_measured_model_gets_a_mode():
    value, why = choose(section(**{"ngram-mod": entry(100.0)}), "/elsewhere/other.gguf")
    assert value is None and "another model" in why


@pytest.mark.parametrize(
    "hostile",
    [
        None,
        [],
        {"modes": "off", "requests": []},
        {"modes": {}, "requests": [{"name": 3}]},
        {"modes": {"off": entry(300.0)}, "requests": []},
        section(off=entry(math.nan)),
        section(off=entry(-1.0)),
        section(
            off={
                "status": "PASS",
                "runs": [{"request": "chat", "status": "PASS", "predicted_ms": True}],
            }
        ),  # fmt: skip
        section(off={"status": "PASS", "runs": "all"}),
        section(**{"ngram-mod": entry(1e-9)}),  # an absurd speed-up
        section(**{"ngram-mod": {**entry(100.0), "runs": [{"request": "chat"}] * 2}}),
    ],
)
def test_hostile_sections_give_plain_decode_with_a_reason(hostile):
    value, why = choose(hostile, MODEL)
    assert value is None and why.endswith("plain decode")


def test_the_goal_says_why_it_is_not_met():
    assert goal({"ngram-mod": GOAL}, {"mode": "ngram-mod"}, "")[0] is True
    met, why = goal({"ngram-mod": 1.1}, {"mode": "ngram-mod"}, "")
    assert not met and "1.10x" in why and "no draft model was configured" in why
    met, why = goal({"draft": 0.5}, None, "/models/draft.gguf")
    assert not met and "1.00x" in why and "0.50x" in why and "no draft model" not in why


def test_flags_per_mode_and_placement():
    assert mode_flags(None, "gpu", "Vulkan0") == []
    assert mode_flags({"mode": "ngram-mod"}, "cpu", "Vulkan0") == ["--spec-type", "ngram-mod"]
    draft = {"mode": "draft", "draft_model": "/m/d.gguf"}
    gpu = mode_flags(draft, "gpu", "Vulkan0")
    assert gpu == ["--model-draft", "/m/d.gguf", "--spec-draft-ngl", "99",
                   "--spec-draft-device", "Vulkan0"]  # fmt: skip
    for placement in ("cpu", "hybrid"):  # the draft decodes token by token: the CPU
        flags = mode_flags(draft, placement, "Vulkan0")
        assert flags[flags.index("--spec-draft-device") + 1] == "none"
    with pytest.raises(ValueError, match="unknown speculative mode"):
        mode_flags({"mode": "eagle"}, "gpu", "Vulkan0")
