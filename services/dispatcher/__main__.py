"""`python -m services.dispatcher`: run the dispatcher (`--help` lists its settings)."""

from services.dispatcher.service import DispatcherService
from services.runtime import main

if __name__ == "__main__":
    main(DispatcherService)
