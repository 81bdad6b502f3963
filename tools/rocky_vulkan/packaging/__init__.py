"""A packaging rehearsal without bitbake: OE's packaging QA over a recipe's real install tree.

- oerules.py    OE's rules (PACKAGES, FILES, directories, ERROR_QA, ...) read from a committed
                data file that tools/scripts/oe-rules-from-dump.py extracts from a `bitbake -e` dump
- bbfile.py     a rendered .bb: its assignments and shell functions, merged over OE's defaults
                the way bitbake would (=, ?=, +=, =+, :append, :prepend), and expanded
- split.py      which package ships each installed file (OE's populate_packages rules)
- elfinfo.py    ELF facts from readelf (is it ELF, RPATH/RUNPATH)
- qa.py         the checks, each named after the OE QA test it stands for
- trees.py      the recipes whose install trees CI checks, and how each tree is made
- cli.py        `python -m rocky_vulkan.packaging ...`: what .ci/llama.sh and the tests call
"""
