FROM python:3.11-slim
# bubblewrap: the sandbox the diagnostic command tools run in (util-linux gives setpriv, prlimit).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap util-linux \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md constraints.txt ./
COPY registry ./registry
COPY workers ./workers
COPY coordinator ./coordinator
COPY agents ./agents
RUN pip install --no-cache-dir -c constraints.txt . && useradd --create-home ongrid
USER ongrid
ENV LITELLM_LOCAL_MODEL_COST_MAP=True
CMD ["ongrid", "worker"]
