"""Typed messages of coms-hermes-bridge and the contract's pure rules.

`wire` holds every value that crosses a socket or a file (the coms envelopes, answer
files, answers, log records), `contract` the rules over them, and `commands` what
the actors tell each other.
"""
