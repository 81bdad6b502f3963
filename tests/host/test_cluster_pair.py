"""`rocky-vulkan cluster pair`: what the boards answer is checked before any board is changed.

The whole command over real SSH to real boards' code is in tests/serve/test_cluster_real.py;
here its checks, with the real `ssh` where a board cannot be reached.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from rocky_selftest.cluster import parse
from rocky_vulkan.cli import main
from rocky_vulkan.config import load_config
from rocky_vulkan.host.board import SshOptions, parse_target
from rocky_vulkan.host.cluster_pair import (
    Member,
    PairError,
    lan_endpoint,
    pair,
    parse_key_answer,
    peers_of,
    targets,
)

from tests.helpers.project import ROOT

CLUSTER = {"subnet": "10.77.0.0/24", "head": "itx", "workers": ["b1", "b2"]}
KEY = "gz4koSurfxanQdvTPWPk7Ir8gcZfnIUw7cLps+j2uwE="
TARGET = parse_target("rocky@b1.local", "rocky")


def answer(board: str = "b1", key: str = KEY, ssh: str = "ssh 10.0.0.5 4242 192.168.1.21 22"):
    return (json.dumps({"board": board, "public_key": key}) + "\n" + ssh + "\n").encode()


def test_a_board_s_answer_gives_its_key_and_the_address_ssh_reached():
    assert parse_key_answer("b1", TARGET, answer()) == (KEY, "192.168.1.21")


@pytest.mark.parametrize(
    ("out", "says"),
    [
        (answer(board="b2"), "says it is board 'b2', not 'b1'"),
        (answer(key="not-a-key"), "sent no WireGuard public key"),
        (answer(key=KEY[:-2] + "B="), "sent no WireGuard public key"),  # not a curve25519 key
        (answer(ssh="ssh 10.0.0.5"), "did not answer as a rocky-llm board does"),
        (answer()[: answer().index(b"\n") + 1], "did not answer as a rocky-llm board does"),
        (b"ok\n" + answer(), "did not answer as a rocky-llm board does"),
        (b'{"board": "b1"}\nssh 1 2 3 4\n', "did not answer as a rocky-llm board does"),
        (b"\x1b[2J\x1b]0;owned\x07\n", "did not answer as a rocky-llm board does"),
        (b"", "did not answer as a rocky-llm board does"),
    ],
)
def test_a_hostile_or_wrong_answer_is_refused(out, says):
    with pytest.raises(PairError) as err:
        parse_key_answer("b1", TARGET, out)
    assert says in str(err.value)
    assert "\x1b" not in str(err.value) and "\x07" not in str(err.value)


def test_the_endpoint_is_an_ipv4_address_the_boards_can_reach():
    assert lan_endpoint("b1", "192.168.1.21", None) == "192.168.1.21"
    assert lan_endpoint("b1", "fd00::21", "192.168.1.30") == "192.168.1.30"
    for seen in ("fd00::21", "127.0.0.1", "0.0.0.0", "224.0.0.1", "b1.local"):
        with pytest.raises(PairError, match="give --endpoint b1=IPV4"):
            lan_endpoint("b1", seen, None)
    with pytest.raises(PairError, match="--endpoint gives '10.0.0.300'"):
        lan_endpoint("b1", "192.168.1.21", "10.0.0.300")


def test_targets_default_to_mdns_names_and_refuse_unknown_boards():
    c = parse(CLUSTER)
    t = targets(c, "rocky", ["b2=root@192.168.1.22"])
    assert {n: x.ssh_dest for n, x in t.items()} == {
        "itx": "rocky@itx.local", "b1": "rocky@b1.local", "b2": "root@192.168.1.22",
    }  # fmt: skip
    with pytest.raises(PairError, match="not a board of cluster"):
        targets(c, "rocky", ["b9=192.168.1.9"])
    with pytest.raises(PairError, match="expected NAME=BOARD"):
        targets(c, "rocky", ["b1"])
    with pytest.raises(Exception, match="is not a host name"):
        targets(c, "rocky", ["b1=-oProxyCommand=sh"])


def test_a_worker_learns_the_head_only_and_the_head_every_worker():
    c = parse(CLUSTER)
    members = {
        n: Member(n, TARGET, KEY[:-2] + f"{c}=", f"192.168.1.{i}")
        for i, (n, c) in enumerate((("itx", "A"), ("b1", "E"), ("b2", "I")), start=10)
    }
    assert set(peers_of(c, "itx", members)) == {"b1", "b2"}
    assert peers_of(c, "b1", members) == {
        "itx": {"public_key": KEY[:-2] + "A=", "endpoint": "192.168.1.10"}
    }


def test_no_cluster_in_the_config_is_said(capsys):
    assert main(["--config", str(ROOT / "rocky-vulkan.yaml"), "cluster", "pair"]) == 2
    assert "has no cluster: (head, workers, subnet): nothing to pair" in capsys.readouterr().err


@pytest.mark.needs_tool("ssh", "Debian: openssh-client")
def test_a_board_that_cannot_be_reached_stops_the_pairing_before_any_board_changes():
    cfg = dataclasses.replace(load_config(ROOT / "rocky-vulkan.yaml"), cluster=CLUSTER)
    said: list[str] = []
    boards = ["itx=itx.invalid", "b1=b1.invalid", "b2=b2.invalid"]
    with pytest.raises(Exception, match="cannot resolve itx.invalid"):
        pair(cfg, boards, [], SshOptions(connect_timeout=5), timeout=30, say=said.append)
    assert said == []
