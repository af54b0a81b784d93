"""`python -m services.scheduler`: run the scheduler shard (`--help` lists its settings)."""

from services.runtime import main
from services.scheduler.service import SchedulerService

if __name__ == "__main__":
    main(SchedulerService)
