"""coms-hermes-bridge: the `user-remote` coms peer that asks the away human through Hermes.
`actors/` and `messages/` install as its subpackages: no generic name in site-packages."""

__version__ = "0.2.0"
