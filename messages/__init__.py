"""`wire`: every value crossing a socket or a file; `contract`: the rules over them;
`commands`: what the actors tell each other."""
