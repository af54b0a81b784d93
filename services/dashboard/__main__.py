"""`python -m services.dashboard`: run the dashboard (`--help` lists its settings)."""

from services.dashboard.service import DashboardService
from services.runtime import main

if __name__ == "__main__":
    main(DashboardService)
