"""The live web dashboard: the cluster at a glance, served over HTTP with server-sent events."""
