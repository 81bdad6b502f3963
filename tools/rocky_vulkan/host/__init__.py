"""Commands on the build host and the user's machine: doctor, build, flash, model, report."""
