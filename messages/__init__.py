"""Typed messages of coms-hermes-bridge and the contract's pure rules.

`wire` holds what crosses the coms sockets, `model` the bridge's own values
(answer files, answers, log records), `contract` the rules over both, and
`commands` what the actors tell each other.
"""
