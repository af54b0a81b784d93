"""`python -m services.rescheduler`: run the rescheduler (`--help` lists its settings)."""

from services.rescheduler.service import ReschedulerService
from services.runtime import main

if __name__ == "__main__":
    main(ReschedulerService)
