# coms-hermes-bridge recipes. `scripts/dev <recipe>` runs them on a fresh machine.

set positional-arguments

# List the recipes (a bare `just` must not start the daemon).
default:
    @"{{just_executable()}}" --justfile "{{justfile()}}" --list

# Signal the daemon, not just: just itself ends with 128 + a signal it receives
# (`scripts/dev run` execs the daemon, so there the status is always the daemon's).

# Launch the daemon (the user-remote coms peer); flags go to coms-hermes-bridge.
run *args: venv
    @exec .venv/bin/coms-hermes-bridge "$@"

# Run the test suite, less the real-hermes group and the slow tests (their own recipes).
# Two workers (pytest-xdist): most tests wait on a daemon, a socket or a file, so two
# at once take about half the time on two cores; `-n 0` after it runs them in one.
test *args: venv
    .venv/bin/python -m pytest -q -n 2 -m "not real_hermes and not slow" "$@"

# The tests that must let real time pass (a sibling bridge down for 25 s, say).
test-slow *args: venv
    .venv/bin/python -m pytest -q -m slow "$@"

# The real `hermes send` (hermes-agent 0.19.0, made in .venv-hermes) under the daemon,
# against a fake Telegram (tests/test_real_hermes.py; docs/testing.md, "The real hermes").
test-hermes *args: venv
    scripts/ensure-hermes-venv >/dev/null
    .venv/bin/python -m pytest -q -m real_hermes "$@"

# The long property-based run (tests/test_fuzz.py, test_unicode.py, test_directives.py): thousands of
# hostile envelopes and answer files instead of the suite's short profile.
fuzz *args: venv
    HYPOTHESIS_PROFILE=long .venv/bin/python -m pytest -q tests/test_fuzz.py tests/test_unicode.py tests/test_directives.py "$@"

# just upstream-suite /path/to/agent-fleet [--upstream] [-- node --test args]
# (just takes a relative path from where it was started, scripts/dev from the checkout)
# Run the TypeScript daemon's own suite against ours (docs/testing.md, "The upstream suite").
upstream-suite path *args:
    cd "{{invocation_directory()}}" && "{{justfile_directory()}}/scripts/upstream-suite" "$@"

# Exits 1 if an acked question is lost or anything is doubled; flags: scripts/chaos.py --help.
# The real daemon SIGKILLed every 0.5–1 s while 200 questions are asked and answered.
chaos *args: venv
    .venv/bin/python scripts/chaos.py "$@"

# Lint and type-check what ships (mypy on the layout as installed: scripts/stage).
check: venv
    #!/usr/bin/env bash
    set -euo pipefail
    .venv/bin/ruff check --no-cache coms_hermes_bridge actors messages scripts tests
    scripts/stage .stage
    cd .stage
    ../.venv/bin/mypy --strict --cache-dir ../.mypy_cache coms_hermes_bridge $(ls scripts/*.py) |
      sed -e 's#^coms_hermes_bridge/\(actors\|messages\)/#\1/#'

# just install-service PROJECT --to telegram:<chat_id> [daemon flags] [--bin PATH] [--no-enable]

# Install and enable the systemd user service for one coms project (docs/operations.md).
install-service project *flags: venv
    @.venv/bin/python scripts/install_service.py "$@"

# Make .venv (the package and its dependencies); then `. .venv/bin/activate` puts
# coms-hermes-bridge on PATH.
setup: venv
    @echo "ready: run \`. .venv/bin/activate\` to put coms-hermes-bridge on PATH"

# Make or refresh the project's virtual environment.
venv:
    @scripts/ensure-venv

# Scores and surviving mutants go to mutants/report.txt; docs/testing.md says more.
# Mutation testing (mutmut) of the contract rules, the question actor and the supervisors.
mutate *modules: venv
    scripts/mutate "$@"
