"""The `slowlink` command line, for people rather than programs: `slowlink demo` now; `bench`, `plan` and
`status` to come. The entry point is `slowlink.cli.main:main`.
"""
