FROM python:3.11-slim
# bubblewrap: the sandbox the diagnostic command tools run in (util-linux gives setpriv, prlimit);
# git: marketplaces and plugins added from git repositories.
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux git \
    && rm -rf /var/lib/apt/lists/*
# Built from /src, which is then removed: the shipped personas are installed with the package
# (ongrid_agents in site-packages), so /app/agents, the ./agents of the working directory, is
# free for a site's own personas (a mount there overrides a shipped one by name).
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY registry ./registry
COPY workers ./workers
COPY coordinator ./coordinator
COPY marketplace ./marketplace
COPY agents ./agents
RUN pip install --no-cache-dir -c constraints.txt . && rm -rf /src && useradd --create-home ongrid \
    && mkdir -p /var/lib/ongrid/agents && chown ongrid /var/lib/ongrid/agents
WORKDIR /app
USER ongrid
ENV LITELLM_LOCAL_MODEL_COST_MAP=True
CMD ["ongrid", "worker"]
