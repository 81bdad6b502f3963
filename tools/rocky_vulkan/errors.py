"""The one exception type the CLI turns into a clean message and exit code."""


class UserError(Exception):
    """A problem the user can fix; the message names the cause and the fix."""

    exit_code = 2
