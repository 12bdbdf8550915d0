# The job as a container image: spark-submit app/main.py with the project's jars (docs/running.md "Running from the image").
# Everything is installed by the project's own setup script (scripts/setup.sh, its runtime-only steps).
#   podman build --build-arg BASE_IMAGE=... -t cdc-lakehouse .     (here: scripts/image.sh, on a debootstrap base)
#   <run the image> --conf s3://bucket/job.yaml [--available-now]   (arguments go to app/main.py)
# Layers go from the slowest-changing input to the fastest: Debian packages (scripts/setup.sh), the Python pins
# (setup.cfg), the jars (deps/jvm-artifacts.txt, jvm/, scripts/fetch_jars.py), and last app/, so that a change to
# the job's code rebuilds one small layer only.
ARG BASE_IMAGE=debian:bookworm-slim

# Builder: a JDK and Maven resolve the `spark` jar set and build cdc-functions.jar; neither tool is in the image.
FROM ${BASE_IMAGE} AS jars
WORKDIR /src
COPY scripts/setup.sh scripts/
RUN scripts/setup.sh build-system
COPY scripts/fetch_jars.py scripts/
COPY deps/jvm-artifacts.txt deps/
COPY jvm/pom.xml jvm/
COPY jvm/src jvm/src
# Behind a TLS-inspecting proxy the build has to trust what the host trusts: scripts/image.sh hands the host's Java
# trust store in as a build secret, mounted for this step only (it is in no layer). Without it, Java's own.
RUN --mount=type=secret,id=java-cacerts \
    if [ -f /run/secrets/java-cacerts ]; then export MAVEN_OPTS=-Djavax.net.ssl.trustStore=/run/secrets/java-cacerts; fi \
    && JAR_SETS=spark scripts/setup.sh jars

# The image: a JRE 17 and Debian's Python 3.11, the pinned wheels in /opt/cdc-lakehouse/.venv, the jars in
# /opt/cdc-lakehouse/.deps/spark: the repository's own layout, as scripts/submit.sh expects it.
FROM ${BASE_IMAGE}
WORKDIR /opt/cdc-lakehouse
COPY scripts/setup.sh scripts/
RUN scripts/setup.sh runtime-system \
    && useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin cdc
COPY setup.cfg ./
# The same for pip and PyPI: the host's CA bundle for this step only, when given.
RUN --mount=type=secret,id=ca-bundle \
    if [ -f /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && scripts/setup.sh python-runtime
COPY --from=jars /src/.deps/spark/*.jar .deps/spark/
COPY app/ app/

# pip's spark-submit finds its Spark home with the python3 first on PATH. spark-submit reads the driver's heap from
# SPARK_DRIVER_MEMORY (spark.driver.memory in the job's YAML comes too late: the JVM is up before it is read).
# PYTHONSAFEPATH: Python would put app/ itself first on sys.path for app/main.py, where a module of app/ could stand
# in for a standard library module of its name; app/main.py adds app/'s parent, the package root, itself.
ENV PATH=/opt/cdc-lakehouse/.venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYSPARK_PYTHON=/opt/cdc-lakehouse/.venv/bin/python \
    PYTHONSAFEPATH=1 \
    SPARK_DRIVER_MEMORY=3g

# Numeric, so that a runtime can check it is not root without reading the image's /etc/passwd.
USER 10001:10001
WORKDIR /home/cdc
# As scripts/submit.sh: the jars on --jars for the session (Spark expands the glob) and on the driver's class path
# (a Java class-path wildcard), where the metastore's JDBC driver must be for DataNucleus.
ENTRYPOINT ["spark-submit", "--jars", "/opt/cdc-lakehouse/.deps/spark/*.jar", \
            "--driver-class-path", "/opt/cdc-lakehouse/.deps/spark/*", "/opt/cdc-lakehouse/app/main.py"]
CMD ["--help"]
