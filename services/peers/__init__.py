"""What a service publishes for its peers, and nothing of its internals: the names and clients
other services use to reach it. A service imports its peers only through here (pyproject's
import-linter contracts: no service imports another service's package)."""
