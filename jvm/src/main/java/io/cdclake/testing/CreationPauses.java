package io.cdclake.testing;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.regex.Pattern;

/**
 * Test only: the crash test's kill points inside a Hudi table's creation, seen from the file system. Hudi
 * creates a table in steps that each write files (HoodieTableMetaClient.createTableLayoutOnStorage: the
 * {@code .hoodie/} folders, then {@code hoodie.properties}; then the first commit, inside which the metadata
 * table is initialised), so the moment before a given file is created is a moment inside creation. The file
 * systems of this package ({@link PausingS3AFileSystem}, {@link PausingLocalFileSystem}) ask {@link #before}
 * before each create and mkdirs.
 *
 * <p>Armed by the environment like devkit/pauses.py: CDC_PAUSE_AT lists points, CDC_PAUSE_DIR is where
 * {@code <point>.json} is written, CDC_PAUSE_TABLE is the table path's end ({@code <database>/<table>}, or
 * {@code _cdc_delete_ledger/<table>}); the first matching create of the process pauses there for good:
 * <pre>
 *   create_layout        before .hoodie/hoodie.properties: the layout folders written, no table properties
 *   create_metadata      before the metadata table's first completed instant: the data table has its
 *                        properties and a pending first commit, the metadata table is half initialised
 *   create_record_index  before the first file of the metadata table's record_index partition
 *   create_first_commit  before the data table's first completed instant: data files, markers and the
 *                        metadata table written, the instant still inflight
 * </pre>
 * CDC_FS_TRACE names a file that gets one line per create, mkdirs, rename and delete (time, operation, path) of
 * paths containing CDC_FS_TRACE_UNDER: how the creation order in the docs was read off a real run.
 */
public final class CreationPauses {

  private static final Pattern COMPLETED = Pattern.compile("\\d+_\\d+\\.(commit|deltacommit|replacecommit)");
  private static final Set<String> REACHED = new HashSet<>();

  private CreationPauses() {}

  /** Called before `op` (create, mkdirs, rename, delete) on `path`; pauses for good when an armed point matches. */
  public static void before(String op, String path) {
    trace(op, path);
    if (!"create".equals(op)) {
      return;
    }
    String dir = System.getenv("CDC_PAUSE_DIR");
    String table = System.getenv().getOrDefault("CDC_PAUSE_TABLE", "");
    List<String> armed = Arrays.asList(System.getenv().getOrDefault("CDC_PAUSE_AT", "").split(","));
    String marker = table + "/.hoodie/";
    int at = path.indexOf(marker);
    if (dir == null || table.isEmpty() || at < 0) {
      return;
    }
    String inMeta = path.substring(at + marker.length());
    String point = pointOf(inMeta);
    if (point == null || !armed.contains(point)) {
      return;
    }
    synchronized (REACHED) {
      if (!REACHED.add(point)) {
        return;
      }
    }
    pause(dir, point, "{\"point\": \"" + point + "\", \"path\": \"" + path + "\"}");
  }

  private static String pointOf(String inMeta) {
    String name = inMeta.substring(inMeta.lastIndexOf('/') + 1);
    if (inMeta.equals("hoodie.properties")) {
      return "create_layout";
    }
    if (inMeta.startsWith("timeline/") && inMeta.indexOf('/', 9) < 0 && COMPLETED.matcher(name).matches()) {
      return "create_first_commit";
    }
    if (inMeta.startsWith("metadata/.hoodie/timeline/") && inMeta.indexOf('/', 26) < 0
        && COMPLETED.matcher(name).matches()) {
      return "create_metadata";
    }
    if (inMeta.startsWith("metadata/record_index/")) {
      return "create_record_index";
    }
    return null;
  }

  /** Writes {@code <dir>/<point>.json} (atomically) and sleeps until the process is killed. */
  static void pause(String dir, String point, String json) {
    try {
      Path target = Path.of(dir, point + ".json");
      Path tmp = Path.of(dir, point + ".json.tmp");
      Files.writeString(tmp, json, StandardCharsets.UTF_8);
      Files.move(tmp, target, StandardCopyOption.ATOMIC_MOVE);
    } catch (IOException e) {
      throw new IllegalStateException("cannot write the pause file in " + dir, e);
    }
    while (true) {
      try {
        Thread.sleep(60_000L);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
    }
  }

  private static void trace(String op, String path) {
    String file = System.getenv("CDC_FS_TRACE");
    if (file == null || !path.contains(System.getenv().getOrDefault("CDC_FS_TRACE_UNDER", "/"))) {
      return;
    }
    String line = System.currentTimeMillis() + " " + op + " " + path + "\n";
    synchronized (REACHED) {
      try {
        Files.writeString(Path.of(file), line, StandardCharsets.UTF_8, StandardOpenOption.CREATE,
            StandardOpenOption.APPEND);
      } catch (IOException e) {
        throw new IllegalStateException("cannot trace to " + file, e);
      }
    }
  }
}
