# The host daemon with the process sandbox backend and the demo agent, FROM
# scratch over the static binaries (`make build`, CGO_ENABLED=0): nothing is
# pulled. The daemon, its turn children, the supervisors and the agents run
# as one unprivileged uid.
FROM scratch
COPY bin/runnerd bin/runnerd-child bin/demoagent /usr/local/bin/
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/runnerd"]
CMD ["run"]
