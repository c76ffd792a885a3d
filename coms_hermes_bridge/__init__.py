"""coms-hermes-bridge: the `user-remote` coms peer that asks the away human through Hermes.

The code lives in the top-level `actors/` and `messages/` folders; they are
installed as `coms_hermes_bridge.actors` and `coms_hermes_bridge.messages` so
that nothing with a generic name lands in site-packages.
"""

__version__ = "0.2.0"
