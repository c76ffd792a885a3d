"""The liaison: the Hermes gateway plugin that turns a human's reply into an answer file
(X14). It is copied into Hermes' plugins folder and runs in Hermes' own Python, so it
imports nothing of the daemon's: only the standard library and this folder."""
