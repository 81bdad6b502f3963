"""The render's one error type, and what to do about a file system error."""

from __future__ import annotations

import errno

from rocky_vulkan.errors import UserError


class RenderError(UserError):
    """The tree cannot be rendered or written; the message names the cause and the fix."""


def os_hint(err: OSError) -> str:
    """What to do about an OSError while reading or writing the tree."""
    if err.errno in (errno.EACCES, errno.EPERM):
        return "make the checkout writable by you (ls -ld it) or render in a copy you own"
    if err.errno == errno.EROFS:
        return "the file system is read-only: render in a writable checkout"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        return "the disk is full: free some space and run `rocky-vulkan render` again"
    return "check the path and its permissions, then run `rocky-vulkan render` again"
