FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY registry ./registry
COPY workers ./workers
COPY coordinator ./coordinator
COPY agents ./agents
RUN pip install --no-cache-dir . && useradd --create-home ongrid
USER ongrid
ENV LITELLM_LOCAL_MODEL_COST_MAP=True
CMD ["ongrid", "worker"]
