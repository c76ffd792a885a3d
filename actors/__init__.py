"""The bridge's actors: one owner for each resource, supervised as a tree."""
