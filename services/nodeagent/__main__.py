"""`python -m services.nodeagent`: run the node agent (`--help` lists its settings)."""

from services.nodeagent.service import NodeAgentService
from services.runtime import main

if __name__ == "__main__":
    main(NodeAgentService)
