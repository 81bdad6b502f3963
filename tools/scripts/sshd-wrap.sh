#!/bin/sh
# ROCKY_SSHD for the tests that need a real sshd (tests/layer/test_image_access.py,
# tests/host/test_board.py), on a host without openssh-server installed, run as root:
#
#   mkdir -p /var/tmp/sshd && cd /var/tmp/sshd && apt-get download openssh-server libwrap0
#   for f in *.deb; do dpkg -x "$f" root; done
#   ROCKY_SSHD="tools/scripts/sshd-wrap.sh" SSHD_ROOT=/var/tmp/sshd/root pytest ...
#
# With openssh-server installed (CI's .ci/run), SSHD_ROOT=/ runs the host's own sshd.
#
# sshd run as root wants its privilege-separation user and /run/sshd: both are made in a private
# mount namespace (a passwd copy with an `sshd` user bound over /etc/passwd, a tmpfs on /run),
# so nothing on the host changes. Arguments go to sshd.
set -e
root=${SSHD_ROOT:-/var/tmp/sshd/root}
[ -x "$root/usr/sbin/sshd" ] || { echo "sshd-wrap.sh: no $root/usr/sbin/sshd (see the comment)" >&2; exit 2; }
exec unshare -m sh -c '
  set -e
  root=$1; shift
  tmp=$(mktemp -d)
  cp /etc/passwd "$tmp/passwd"
  grep -q "^sshd:" "$tmp/passwd" || echo "sshd:x:110:65534::/run/sshd:/usr/sbin/nologin" >>"$tmp/passwd"
  mount --make-rprivate /
  mount --bind "$tmp/passwd" /etc/passwd
  mount -t tmpfs tmpfs /run
  mkdir -m 755 /run/sshd
  LD_LIBRARY_PATH="$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu" exec "$root/usr/sbin/sshd" "$@"
' sshd-wrap "$root" "$@"
