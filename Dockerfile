# syntax=docker/dockerfile:1
# Build stage: compile TypeScript with the dev dependencies.
FROM node:22-bookworm-slim AS build
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json tsconfig.build.json ./
COPY src ./src
RUN npm run build

# Runtime stage: production dependencies only, non-root.
FROM node:22-bookworm-slim
ENV NODE_ENV=production
WORKDIR /app
COPY package.json package-lock.json ./
# npm is needed to install, not to run: it leaves the runtime image with its cache (smaller, fewer CVEs).
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force \
 && rm -rf /usr/local/lib/node_modules/npm /usr/local/lib/node_modules/corepack /usr/local/bin/npm /usr/local/bin/npx /usr/local/bin/corepack /root/.npm
COPY --from=build /app/dist ./dist
COPY bin ./bin
COPY lua ./lua
COPY admin-ui ./admin-ui
COPY gateway.schema.json ./
# The image's default config listens on 0.0.0.0 (reachable through -p) and proxies to $BACKEND_URL.
COPY examples/gateway.docker.yaml ./gateway.yaml
USER node
EXPOSE 8080 9901
# The health check reaches the admin listener on 127.0.0.1:9901: a mounted config keeps admin on port 9901 (0.0.0.0 to be scraped).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:9901/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
# Exec form: node is PID 1 itself (no shell in between), so SIGHUP (reload) and SIGTERM (drain) reach the
# gateway; one sent before Node has loaded the CLI finds no handler and PID 1 drops it (docker run --init).
ENTRYPOINT ["node", "bin/gateway"]
CMD ["start", "-c", "/app/gateway.yaml"]
