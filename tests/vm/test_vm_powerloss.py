"""Power loss, as a board meets it: qemu killed (SIGKILL: the disk keeps what reached it, nothing
is flushed or unmounted) during the first-boot self-test, and during a `rocky-llm pull`. The next
boot of the same disk must give a verdict, and the model store must hold no half-written model.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import time

import pytest

from tests.helpers.vm import MARKS, SELFTEST_TIMEOUT_S, boot, build_disk, needs_llama

# Two more first boots, each with a self-test: beyond CI's time, a recorded run
# (docs/verification/vm.md).
pytestmark = [*MARKS, needs_llama, pytest.mark.needs_vm_powerloss]

STAMP = "/var/lib/rocky-selftest/first-boot.stamp"  # written once a verdict is saved
RESULT = "/var/lib/rocky-selftest/result.json"


def _power_cut(guest) -> None:
    guest.vm.proc.kill()
    guest.vm.proc.wait(60)


def test_power_lost_during_the_selftest_the_next_boot_gives_a_verdict(tmp_path):
    disk, key = build_disk(tmp_path)
    guest = boot(disk, key)
    try:
        guest.wait(
            "systemctl show -P ActiveState rocky-selftest.service | grep -qx activating",
            600, "the self-test to start",
        )  # fmt: skip
        time.sleep(5)
        assert guest.run(f"test -e {STAMP}").returncode != 0  # cut before it finished
    finally:
        _power_cut(guest)
    guest = boot(disk, key)
    try:
        guest.wait(f"test -f {STAMP}", SELFTEST_TIMEOUT_S, "the self-test's second run")
        result = json.loads(guest.out(f"cat {RESULT}"))
        # By design the cut run is reported, not run again (a GPU hang must not loop): ERROR,
        # naming the interruption and the step it was in.
        assert result["verdict"] == "ERROR", result
        said = " ".join(result["errors"])
        assert "interrupted" in said and "in an earlier boot" in said, said
        status = guest.run("rocky-selftest status")
        assert "ERROR" in status.stdout + status.stderr, status
    finally:
        guest.vm.stop()


class _SlowFile(http.server.BaseHTTPRequestHandler):
    """One file, sent slowly, so the pull is still running when the power goes."""

    data = b""

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.data)))
        self.end_headers()
        for i in range(0, len(self.data), 1 << 16):
            self.wfile.write(self.data[i : i + (1 << 16)])
            time.sleep(0.05)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def slow_server():
    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), _SlowFile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_power_lost_during_a_pull_leaves_no_half_written_model(tmp_path, slow_server):
    from rocky_vulkan.llama.testmodel import write_preset

    model = write_preset("tiny", tmp_path / "pulled.gguf", seed=5).read_bytes()
    # A valid GGUF whose tail is padding the loader never reads: big enough to be mid-way.
    _SlowFile.data = model + b"\0" * (48 << 20)
    sha = hashlib.sha256(_SlowFile.data).hexdigest()
    disk, key = build_disk(tmp_path)
    guest = boot(disk, key)
    url = f"http://10.0.2.2:{slow_server.server_address[1]}/pulled.gguf"  # the host, from slirp
    try:
        guest.run(
            f"sudo systemd-run --unit=pull-test rocky-llm pull {url} --sha256 {sha} "
            "--license MIT --name pulled"
        )
        guest.wait(
            "sudo find /var/lib/rocky-llm/models -name '*.part' -size +1M | grep -q .",
            600, "the pull to be under way",
        )  # fmt: skip
    finally:
        _power_cut(guest)
    guest = boot(disk, key)
    try:
        listed = guest.out("rocky-llm list")
        assert "pulled" not in listed, listed
        files = guest.out("sudo find /var/lib/rocky-llm/models -type f -name '*.gguf'")
        assert "pulled" not in files, files  # only a .part (resumable), never a .gguf
    finally:
        guest.vm.stop()
