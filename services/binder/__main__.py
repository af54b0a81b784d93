"""`python -m services.binder`: run the binder (`--help` lists its settings)."""

from services.binder.service import BinderService
from services.runtime import main

if __name__ == "__main__":
    main(BinderService)
