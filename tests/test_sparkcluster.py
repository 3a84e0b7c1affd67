"""tests/sparkcluster.py without Spark: its config comes from the spark role."""

import shutil

from tests import sparkcluster
from tests.sparkcluster import SparkStandaloneCluster


def test_the_daemons_config_is_the_spark_roles_with_kill_links_off():
    assert sparkcluster.role_defaults()["spark_ui_kill_enabled"] is False
    cluster = SparkStandaloneCluster(workers=1, auth_secret="s3cret-for-test")
    try:
        lines = cluster.spark_defaults_path.read_text().splitlines()
        settings = dict(line.split(None, 1) for line in lines if line and not line.startswith("#"))
        assert settings["spark.ui.killEnabled"] == "false"
        assert settings["spark.master.rest.enabled"] == "false"
        assert settings["spark.authenticate"] == "true"
        assert settings["spark.authenticate.secret"] == "s3cret-for-test"
        assert settings["spark.master"] == cluster.master_url
        assert cluster.spark_defaults_path.stat().st_mode & 0o077 == 0  # the secret's file: 0600
    finally:
        shutil.rmtree(cluster.scratch)
