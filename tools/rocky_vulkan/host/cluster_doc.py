"""The `cluster` section of a board's result.json (a head's self-test: this board alone and
spread over its workers by whole layers, tensor parallelism and layers by speed), read as
hostile input like the rest of the file, and its rows in the report. The ratios are computed
here from the rates, never taken from the board."""

from __future__ import annotations

import re
from typing import Any

from rocky_selftest.cluster_speed import SPLIT_RE

MODES = ("alone", "cluster")
# Measured since tensor parallelism and the split by speed; absent in an older board's result.
LATER_MODES = {"tensor": "tensor parallel", "speed": "layers by speed"}
MAX_RATE = 1e9
MAX_WORKERS = 64
# host:port as cluster.rpc_endpoints writes it: an IPv4 address of the cluster's subnet
ENDPOINT = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}:\d{1,5}")


def _mode(raw: Any, mode: str, c: Any) -> dict[str, Any]:
    field = f"cluster.modes.{mode}"
    if not isinstance(raw, dict):
        c.bad(field, raw, "an object")
        return {"status": "BAD", "reason": "", "pp_tps": None, "tg_tps": None}
    out = {
        "status": c.word(raw, "status", f"{field}.status", ("PASS", "FAIL")) or "BAD",
        "reason": c.text(raw, "reason", f"{field}.reason"),
        "pp_tps": c.number(raw, "pp_tps", f"{field}.pp_tps", 0, MAX_RATE),
        "tg_tps": c.number(raw, "tg_tps", f"{field}.tg_tps", 0, MAX_RATE),
    }
    if out["status"] == "PASS" and (out["pp_tps"] is None or out["tg_tps"] is None):
        c.problems.append(f"{field}: status PASS without both pp_tps and tg_tps")
    return out


def cluster_section(raw: Any, c: Any) -> dict[str, Any] | None:
    """The checked section (None when the board has none: not a head, or workers not paired);
    `state` is "malformed" when any field was, and `c` (result_doc's checker) holds the
    problems."""
    if raw is None:
        return None
    before = len(c.problems)
    out: dict[str, Any] = {"state": "malformed", "workers": [], "modes": {}}
    if not isinstance(raw, dict):
        c.bad("cluster", raw, "an object")
        return out
    workers = raw.get("workers")
    if not isinstance(workers, list) or not 0 < len(workers) <= MAX_WORKERS:
        c.bad("cluster.workers", workers, f"a list of 1..{MAX_WORKERS} workers")
        workers = []
    for i, w in enumerate(workers):
        if isinstance(w, str) and ENDPOINT.fullmatch(w):
            out["workers"].append(w)
        else:
            c.bad(f"cluster.workers[{i}]", w, "an address:port")
    out["prompt_tokens"] = c.whole(raw, "prompt_tokens", "cluster.prompt_tokens", None, 1 << 20)
    out["decode_tokens"] = c.whole(raw, "decode_tokens", "cluster.decode_tokens", None, 1 << 20)
    modes = raw.get("modes")
    if not isinstance(modes, dict):
        c.bad("cluster.modes", modes, "an object")
        modes = {}
    for mode in MODES:
        out["modes"][mode] = _mode(modes.get(mode), mode, c)
    for mode in LATER_MODES:
        if mode in modes:
            out["modes"][mode] = _mode(modes[mode], mode, c)
    shares = raw.get("tensor_split")
    out["tensor_split"] = None
    if isinstance(shares, str) and SPLIT_RE.fullmatch(shares):
        out["tensor_split"] = shares
    elif shares is not None:
        c.bad("cluster.tensor_split", shares, "shares such as 0.500/0.500, or null")
    if len(c.problems) == before:
        out["state"] = "ok"
    return out


def _rates(entry: dict[str, Any], base: dict[str, Any] | None) -> str:
    if entry["status"] != "PASS":
        return f"{entry['status']}: {entry['reason'] or 'no reason given'}"
    text = f"pp {entry['pp_tps']:.2f} t/s, tg {entry['tg_tps']:.2f} t/s"
    if base is not None and base["status"] == "PASS":
        text += (
            f" = {entry['pp_tps'] / base['pp_tps']:.2f}x / {entry['tg_tps'] / base['tg_tps']:.2f}x"
            " this board alone"
        )
    return text


def cluster_rows(section: dict[str, Any] | None) -> list[tuple[str, str, str, str]]:
    """This board alone, then with its workers by whole layers, by tensor parallelism and by
    whole layers split by each device's speed (prefill and decode, and both ratios)."""
    if section is None:
        return [("cluster", "not in this result (not a cluster head, or no worker answered)",
                 "", "-")]  # fmt: skip
    if section["state"] != "ok":
        return [("cluster", "malformed: the fields are named in the BAD rows below", "",
                 "BAD")]  # fmt: skip
    alone, spread = section["modes"]["alone"], section["modes"]["cluster"]
    size = f"pp{section['prompt_tokens'] or '?'} / tg{section['decode_tokens'] or '?'}"
    over = f"(over {', '.join(section['workers'])})"
    n = len(section["workers"])
    rows = [
        ("cluster: alone", _rates(alone, None), size, alone["status"]),
        (
            f"cluster: layers, {n} worker(s)",
            f"{_rates(spread, alone)} {over}",
            size,
            spread["status"],
        ),  # fmt: skip
    ]
    for mode, name in LATER_MODES.items():
        entry, label = section["modes"].get(mode), f"cluster: {name}, {n} worker(s)"
        if entry is None:
            rows.append((label, "not measured (a self-test before it)", "", "-"))
            continue
        shares = (
            f" (-ts {section['tensor_split']})"
            if mode == "speed" and section["tensor_split"]
            else ""
        )
        rows.append((label, f"{_rates(entry, alone)} {over}{shares}", size, entry["status"]))
    return rows
