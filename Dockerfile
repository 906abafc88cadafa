# The runtime's image: API, workers and Flower all run it (docker-compose.yml,
# deploy/kubernetes/). Where base images cannot be pulled, deploy/smoke.py builds local
# stand-ins under the same names from Debian's packages (deploy/standins/).
FROM python:3.11-slim
# bubblewrap: the sandbox the diagnostic command tools run in (util-linux gives setpriv, prlimit);
# git: marketplaces and plugins added from git repositories.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux git \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The dependencies first, at the pinned versions: a change to the code rebuilds only the
# layers below (seconds) instead of reinstalling ~110 packages.
COPY pyproject.toml constraints.txt ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
    && pip install --no-cache-dir -c constraints.txt -r requirements.txt
COPY README.md ./
COPY registry ./registry
COPY workers ./workers
COPY coordinator ./coordinator
COPY marketplace ./marketplace
COPY agents ./agents
# The personas are baked at /app/agents, the ./agents of the working directory, and load from
# there (ONGRID_SHIPPED_AGENTS=0: not a second time from the package); mount a directory there
# to run a site's own set instead. /var/lib/ongrid/agents is the marketplace root (a volume),
# /var/lib/ongrid/data the data directory (the API's local admin token, Flower's login).
RUN pip install --no-cache-dir --no-deps -c constraints.txt . \
    && mkdir -p /app/agents && cp agents/*.md /app/agents/ && cd / && rm -rf /src \
    && useradd --create-home ongrid \
    && mkdir -p /var/lib/ongrid/agents /var/lib/ongrid/data \
    && chown ongrid /var/lib/ongrid/agents /var/lib/ongrid/data && chmod 700 /var/lib/ongrid/data
WORKDIR /app
USER ongrid
ENV LITELLM_LOCAL_MODEL_COST_MAP=True ONGRID_SHIPPED_AGENTS=0 ONGRID_DATA_DIR=/var/lib/ongrid/data
CMD ["ongrid", "worker"]
