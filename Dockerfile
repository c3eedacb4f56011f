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
RUN npm ci --omit=dev --no-audit --no-fund && npm cache clean --force
COPY --from=build /app/dist ./dist
COPY bin ./bin
COPY lua ./lua
COPY gateway.yaml gateway.schema.json ./
USER node
EXPOSE 8080 9901
# The admin listener must be reachable inside the container for the health check (admin: 0.0.0.0:9901 or 127.0.0.1:9901).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["node", "-e", "fetch('http://127.0.0.1:9901/healthz').then(r=>process.exit(r.ok?0:1),()=>process.exit(1))"]
# Exec form: the gateway is PID 1's direct child-less process, so SIGHUP (reload) and SIGTERM (drain) reach it.
ENTRYPOINT ["node", "bin/gateway"]
CMD ["start", "-c", "/app/gateway.yaml"]
