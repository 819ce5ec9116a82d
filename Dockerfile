# Builds a runnable image without pulling anything: run `make build` first
# (static binaries, CGO_ENABLED=0), then `docker build -t runnerd .`.
FROM scratch
COPY bin/runnerd bin/runnerd-child bin/controlplane bin/demoagent /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/controlplane"]
CMD ["serve", "--data-dir", "/data", "--listen", ":8080"]
