"""The configuration's datasets and object stores (issue 41; docs/control-plane.md, "Storage").

    datasets:                       # the catalogue an operator keeps (members add with `yard dataset add`)
      - {name: corpus, version: v1, source: "s3://corpora/corpus.jsonl", team: nlp,
         checksum: "sha256:…", grants: [vision]}
    storage:
      object_stores:                # what the plane may read (and archive to), with whose credentials
        - {url: "s3://corpora", endpoint_url: "http://127.0.0.1:8333", credentials_file: /etc/trainyard/s3.cred,
           teams: [nlp]}
      dataset_cache: {max_gb: 200}  # each node's cache of staged datasets

A dataset belongs to a team; another team's jobs may use it only with a grant (`grants`). A job
pins each dataset's version and checksum at submit (`jobs.datasets`). `credentials_file` holds
two lines, the access key id and the secret (a file only root reads, as the registry credentials of `images:`);
without one the store is read anonymously.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainyard.staging.types import CHECKSUM_RE, NAME_RE, VERSION_RE
from trainyard.spec import bounds as B

MAX_DATASETS = 10_000
MAX_OBJECT_STORES = 100
SOURCE_RE = r"^(/[^\x00\n]*|s3://[a-z0-9][a-z0-9.-]{1,62}[a-z0-9](/[^\x00\n]*)?)$"
Team = Annotated[str, Field(min_length=1, max_length=B.MAX_NAME)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class DatasetSpec(_Model):
    """One version of a dataset in the configuration's catalogue."""

    name: str = Field(pattern=NAME_RE.pattern)
    version: str = Field(pattern=VERSION_RE.pattern)
    source: str = Field(max_length=4096, pattern=SOURCE_RE)
    team: Team
    # required here: what every node verifies its copy against (`yard dataset add` computes it for members;
    # `yard dataset checksum PATH` prints one for an operator)
    checksum: str = Field(pattern=CHECKSUM_RE.pattern)
    grants: list[Team] = Field(default_factory=list, max_length=B.MAX_TEAMS)
    description: str = Field("", max_length=1000)


class ObjectStoreSpec(_Model):
    """An object store the plane reads datasets from and may archive checkpoints to."""

    url: str = Field(max_length=1000, pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,62}[a-z0-9](/[^\x00\n]*)?$")
    endpoint_url: str | None = Field(None, max_length=1000, pattern=r"^https?://[^\s]+$")
    region: str | None = Field(None, max_length=100)
    credentials_file: str | None = Field(None, max_length=4096, pattern=r"^/[^\x00\n]*$")
    teams: list[Team] | None = Field(None, max_length=B.MAX_TEAMS)  # None: every team's datasets may name it

    @field_validator("url")
    @classmethod
    def _no_trailing_slash(cls, v: str) -> str:
        return v.rstrip("/")


class DatasetCacheSpec(_Model):
    """Each node's cache of staged datasets: at most `max_gb` (GB = 2^30 bytes); the least recently
    used entries no running job uses are evicted to make room."""

    max_gb: float = Field(100.0, gt=0, le=B.MAX_STORAGE_GB)

    @property
    def max_bytes(self) -> int:
        return int(self.max_gb * 2**30)
