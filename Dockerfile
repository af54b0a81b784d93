# One image for every Gödel component; docker-compose.yml picks the component by command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
COPY . .
RUN pip install . && useradd --create-home --uid 10001 godel

# Run from the user's home, not /src: the installed packages are the ones imported.
USER godel
WORKDIR /home/godel

# Services listen on all interfaces inside the container, log JSON lines to stdout.
ENV GODEL_HOST=0.0.0.0 \
    GODEL_PORT=50051 \
    GODEL_LOG_FORMAT=json \
    GODEL_HOME=/home/godel/.godel
EXPOSE 50051

CMD ["godel", "--help"]
