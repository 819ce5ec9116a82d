# The control plane, FROM scratch over the static binary (`make build`,
# CGO_ENABLED=0): nothing is pulled. Runs as an unprivileged uid.
FROM scratch
COPY bin/controlplane /usr/local/bin/controlplane
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/controlplane"]
CMD ["serve", "--listen", ":8080", "--data-dir", "/var/lib/controlplane"]
