"""A real Schema Registry for the tests: Apicurio Registry 2.0.2, serving Confluent's API at
``/apis/ccompat/v6``, built from its Maven Central jars and run on loopback.

Why this one (issue 36): Karapace is not on the package index these machines reach, Confluent's
registry is not on Maven Central, and Apicurio's newer apps (2.1 and up) depend on
``apicurio-registry-schema-util-provider``, which the Maven mirror does not serve. 2.0.2 resolves
once ``org.everit.json.schema`` (a JitPack artifact, used for JSON Schema *compatibility* rules
only) is left out, and builds with its own Quarkus (1.12.2) into a runnable jar; its in-memory
storage starts in ~1.5 s. Its JAX-RS resources live in dependency jars without a Jandex index, so
the build indexes them (``quarkus.index-dependency``), or every path answers 404.

What this Apicurio does not do like Confluent's registry (the gateway copes with both): ``GET
/schemas/ids/{id}`` does not say ``schemaType`` for Protobuf or JSON schemas, and an incompatible
schema's 409 carries ``error_code`` 0.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.cli import maven
from gateway.cli.devstack import free_port

VERSION = "2.0.2.Final"
QUARKUS = "1.12.2.Final"
#: Bumped whenever the build changes, so that an old build in the cache is not taken for it.
REVISION = 1

_POM = f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mqgw</groupId><artifactId>schema-registry</artifactId><version>1</version>
  <properties>
    <maven.compiler.release>11</maven.compiler.release>
    <project.build.sourceEncoding>UTF-8</project.build.sourceEncoding>
  </properties>
  <dependencyManagement><dependencies><dependency>
    <groupId>io.quarkus</groupId><artifactId>quarkus-bom</artifactId><version>{QUARKUS}</version>
    <type>pom</type><scope>import</scope>
  </dependency></dependencies></dependencyManagement>
  <dependencies><dependency>
    <groupId>io.apicurio</groupId><artifactId>apicurio-registry-app</artifactId>
    <version>{VERSION}</version>
    <exclusions><exclusion>
      <groupId>com.github.everit-org.json-schema</groupId><artifactId>*</artifactId>
    </exclusion></exclusions>
  </dependency></dependencies>
  <build><plugins><plugin>
    <groupId>io.quarkus</groupId><artifactId>quarkus-maven-plugin</artifactId><version>{QUARKUS}</version>
    <executions><execution><goals><goal>build</goal></goals></execution></executions>
  </plugin></plugins></build>
</project>
"""
#: The modules whose classes Quarkus must index (REST resources, CDI beans).
_INDEXED = ("apicurio-registry-app", "apicurio-registry-common",
            "apicurio-registry-schema-compatibility-protobuf",
            "apicurio-registry-utils-import-export")


def _build(libs: Path, work: Path) -> None:
    """The Quarkus build of the app: its own application.properties plus the index lines; the
    runnable jar and its lib/ replace the plain dependency copy."""
    app = next(libs.glob("apicurio-registry-app-*.jar"))
    with zipfile.ZipFile(app) as z:
        props = z.read("application.properties").decode()
    props += "\n" + "".join(f"quarkus.index-dependency.{a}.group-id=io.apicurio\n"
                            f"quarkus.index-dependency.{a}.artifact-id={a}\n" for a in _INDEXED)
    resources = work / "src" / "main" / "resources"
    resources.mkdir(parents=True)
    (resources / "application.properties").write_text(props)
    mvn = shutil.which("mvn") or "mvn"
    out = subprocess.run([mvn, "-q", "-B", "package", "-DskipTests"], cwd=work,
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"the registry's Quarkus build failed:\n{(out.stdout + out.stderr)[-3000:]}")
    shutil.rmtree(libs)
    libs.mkdir()
    shutil.move(str(next((work / "target").glob("*-runner.jar"))), libs / "registry-runner.jar")
    shutil.move(str(work / "target" / "lib"), libs / "lib")


def resolve() -> Path:
    return maven.resolve(maven.cache_dir("MQGW_SCHEMA_REGISTRY_DIST",
                                         f"apicurio-registry-{VERSION}-{REVISION}"),
                         _POM, f"Apicurio Registry {VERSION}", "Java 17", then=_build)


@dataclass
class Registry:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        """The Confluent-compatible API's base URL."""
        return f"http://127.0.0.1:{self.port}/apis/ccompat/v6"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(log_dir: Path, timeout: float = 120.0) -> Registry:
    dist = resolve()
    port = free_port()
    log = log_dir / f"schema-registry-{port}.log"
    java = shutil.which("java") or "java"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [java, "-Xmx256m", "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={port}",
             "-jar", str(dist / "registry-runner.jar")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    reg = Registry(proc, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the schema registry exited: {log.read_text()[-3000:]}")
        try:
            if httpx.get(reg.url + "/subjects", timeout=1).status_code == 200:
                return reg
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    reg.stop()
    raise TimeoutError(f"the schema registry did not start: {log.read_text()[-3000:]}")
