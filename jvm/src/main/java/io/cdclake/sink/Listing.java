package io.cdclake.sink;

import java.io.IOException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocatedFileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RemoteIterator;

/**
 * A folder's files in one call from Python (app/sink/lakefs.py {@code list_files}): walked from py4j, each file costs
 * three calls into the JVM (the iterator's next, the status's path, its text) and three more to release what they
 * returned. A delete ledger's listing (32 files before its compaction) runs twice a table and batch.
 */
public final class Listing {
  private Listing() {
  }

  /**
   * The paths of every file below {@code root} (recursively) whose name ends with {@code suffix}, relative to root,
   * one a line; empty when root does not exist.
   */
  public static String files(FileSystem fs, Path root, String suffix) throws IOException {
    if (!fs.exists(root)) {
      return "";
    }
    String base = fs.makeQualified(root).toString();
    base = base.endsWith("/") ? base : base + "/";
    StringBuilder found = new StringBuilder();
    RemoteIterator<LocatedFileStatus> files = fs.listFiles(root, true);
    while (files.hasNext()) {
      String name = files.next().getPath().toString();
      if (name.endsWith(suffix)) {
        found.append(name.startsWith(base) ? name.substring(base.length()) : name).append('\n');
      }
    }
    return found.toString();
  }
}
